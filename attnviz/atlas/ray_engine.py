"""The Ray engine: the atlas's batches as Ray Data batch inference, the model held by actors.

The driver reads and tokenises the corpus and cuts it into shards and batches exactly as the
local engine does (`attnviz.atlas.corpus.batch_plan`, padding kept small); Ray Data then
streams the batches, one dataset row each, through ``map_batches`` into a pool of
`AtlasWorker` actors, each loading the model once and running
`attnviz.atlas.engine.run_batch`, the very function of the local engine, on the very same
batches. Results come back as bytes (numpy arrays and JSON, no pickle) and the driver writes each
shard as soon as all its batches are in. The corpus comes chunk by chunk
(`attnviz.atlas.corpus.read_chunks`), one dataset per chunk, so the driver and the object store
hold one chunk's batches at a time.

Actors are sized from the nodes, never from the cluster's total: Ray places an actor only on a
node that holds everything it asks for (`plan_actors` says how).

Without ``RAY_ADDRESS`` in the environment a local Ray is started (dashboard off, every server
on 127.0.0.1 only) and stopped at the end; with it, Ray connects to that cluster
(``ray://head:10001`` through Ray Client, or ``auto`` on a node of the cluster). A Ray the caller
has already started with ``ray.init`` is used as it is, and left running. Every node must see the
model folder at the same path (a shared file system), and have attnviz and Ray installed:
``pip install "attnviz[ray]"``.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.atlas.corpus import Sentence, batch_plan
from attnviz.atlas.engine import BatchResult, run_batch
from attnviz.checkpoints import load_checkpoint
from attnviz.errors import AtlasError, AttnvizError

CPUS_PER_ACTOR = 4  # torch threads per CPU actor: fewer, larger actors hold fewer copies of the model
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

log = logging.getLogger(__name__)


def _sentences_json(sentences: Sequence[Sentence]) -> str:
    return json.dumps(
        [[s.line, s.src, s.src_ids, s.src_tokens, s.tgt_ids, s.tgt_tokens] for s in sentences], ensure_ascii=False
    )


def _sentences_from_json(text: str) -> tuple[Sentence, ...]:
    def tuple_or_none(x):
        return None if x is None else tuple(x)

    return tuple(
        Sentence(int(line), str(src), tuple(ids), tuple(tokens), tuple_or_none(tgt_ids), tuple_or_none(tgt_tokens))
        for line, src, ids, tokens, tgt_ids, tgt_tokens in json.loads(text)
    )


def encode_result(result: BatchResult) -> bytes:
    """A BatchResult as .npz bytes: arrays, and the sentences as JSON. Never pickled."""
    arrays = {f"stats/{k}": v for k, v in result.stats.items()}
    arrays |= {f"divergences/{k}": v for k, v in result.divergences.items()}
    arrays["sentences"] = np.array(_sentences_json(result.sentences))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_result(data: bytes) -> BatchResult:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        sentences = _sentences_from_json(str(z["sentences"]))
        stats = {name.split("/", 1)[1]: z[name] for name in z.files if name.startswith("stats/")}
        divergences = {name.split("/", 1)[1]: z[name] for name in z.files if name.startswith("divergences/")}
    return BatchResult(sentences, stats, divergences)


def _rows(shards: dict[int, Sequence[Sentence]], batch_size: int) -> list[dict]:
    """One dataset row per batch, with its shard's number and its own within the shard: the local
    engine's batches (run_local)."""
    return [
        {"shard": shard, "batch": number, "sentences": _sentences_json(batch)}
        for shard, sentences in shards.items()
        for number, batch in enumerate(batch_plan(sentences, batch_size))
    ]


class AtlasWorker:
    """A Ray actor holding one copy of the model; called by ``map_batches`` with rows that are batches."""

    def __init__(self, checkpoint: str, sha256: str, device: str, precision: str, threads: int):
        torch.set_num_threads(threads)
        self.bundle = load_checkpoint(checkpoint, device)
        if self.bundle.sha256 != sha256:
            raise AtlasError(
                f"the model folder {checkpoint} on this node is not the driver's (checkpoint hash differs): "
                "every node must see the same model"
            )
        self.precision = precision

    def __call__(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Each row's batch run as it is (``map_batches`` hands over one row at a time)."""
        results = [
            run_batch(self.bundle, _sentences_from_json(str(text)), self.precision) for text in rows["sentences"]
        ]
        payloads = [encode_result(r) for r in results]
        return pd.DataFrame({"shard": rows["shard"].to_numpy(), "batch": rows["batch"].to_numpy(), "payload": payloads})


@dataclass(frozen=True)
class ActorPlan:
    """How many actors of what size the atlas runs on a cluster."""

    resources: dict  # what each actor asks Ray for: num_cpus, and num_gpus on GPUs
    actors: int  # how many
    threads: int  # torch threads per actor
    device: str  # "cpu" or "cuda"


def plan_actors(nodes: Sequence[dict], device: str) -> ActorPlan:
    """The actors for live nodes whose resources are ``nodes`` (each ``{"CPU": n, "GPU": m}``, as
    ``ray.nodes()`` gives them), on ``device`` ("cpu", "cuda" or "auto"); AtlasError when none fits.

    On GPUs, one actor per GPU of any node (and one CPU beside it). On CPUs every actor has the same
    size, the largest of at most `CPUS_PER_ACTOR` CPUs that leaves the fewest CPUs idle over all the
    nodes: nodes of 4 and 2 CPUs get 3 actors of 2, nodes of 1 CPU one actor each, nodes of 3 and 4
    CPUs 7 actors of 1 (each holds its own copy of the model: more copies, no CPU idle). Actors of
    one size fit the nodes exactly (each node takes its CPUs // size of them), which Ray Data's pool,
    of one size, needs.
    """
    cpus = [int(node.get("CPU", 0)) for node in nodes]
    gpus = [int(node.get("GPU", 0)) for node in nodes]
    shapes = ", ".join(f"{c} CPUs and {g} GPUs" for c, g in zip(cpus, gpus, strict=True)) or "none"
    if device in ("cuda", "auto"):
        on_gpus = sum(g for c, g in zip(cpus, gpus, strict=True) if c >= 1)
        if on_gpus:
            return ActorPlan({"num_gpus": 1, "num_cpus": 1}, on_gpus, 1, "cuda")
        if device == "cuda":
            raise AtlasError(
                f"--device cuda was asked for but no node of the Ray cluster has a GPU and a CPU (nodes: {shapes}); "
                "use --device cpu or auto"
            )
    if not any(cpus):
        raise AtlasError(f"no node of the Ray cluster has a CPU for an actor (nodes: {shapes}); start nodes with CPUs")
    size = max(range(1, CPUS_PER_ACTOR + 1), key=lambda d: (sum(c // d * d for c in cpus), d))
    return ActorPlan({"num_cpus": size}, sum(c // size for c in cpus), size, "cpu")


def _live_nodes() -> list[dict]:
    """The resources of every live node of the cluster Ray is connected to."""
    import ray

    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def run_ray(
    checkpoint: Path,
    sha256: str,
    chunks: Iterable[dict[int, Sequence[Sentence]]],
    batch_size: int,
    precision: str,
    device: str,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, list[BatchResult]]]:
    """(shard number, its batches' results) for every shard of ``chunks`` (per chunk of the corpus,
    its shards by number), as each one completes: one Ray dataset per chunk, chunks read one at a time.

    The actors are planned (`plan_actors`) before any chunk is read: a cluster where none fits is
    one AtlasError before any work.
    """
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        # Ray's own switch for a single-machine Ray (meant for laptops): its node address becomes
        # 127.0.0.1 and every server it starts listens there only. Read when Ray is imported.
        os.environ.setdefault(LOCAL_ONLY, "0")
    try:
        import ray
    except ImportError:
        raise AtlasError('the Ray engine needs Ray: pip install "attnviz[ray]" (or pip install ray)') from None
    started = not ray.is_initialized()
    if started:
        local = {} if address else {"include_dashboard": False}
        ray.init(address=address or None, logging_level=logging.ERROR, log_to_driver=False, **local)
    try:
        import ray.data  # first: importing it configures its logger, at DEBUG with a console handler

        logging.getLogger("ray.data").setLevel(logging.ERROR)  # its plan and timings; failures still raise
        ray.data.DataContext.get_current().enable_progress_bars = False  # the CLI draws its own
        plan = plan_actors(_live_nodes(), device)
        log.info("Ray engine: %d actors of %s", plan.actors, plan.resources)
        from ray.data.exceptions import ExecutionTimeoutError

        for shards in chunks:
            if shards:
                try:
                    yield from _run_chunk(ray, plan, checkpoint, sha256, shards, batch_size, precision, on_batch)
                except (ray.exceptions.RayError, ExecutionTimeoutError) as e:  # a node lost for good, a stuck dataset
                    raise one_line(e) from None
    finally:
        if started:
            ray.shutdown()


def one_line(error: BaseException) -> AtlasError:
    """The one line a failed Ray run ends with: an attnviz error raised in an actor (a node that sees
    another model) with its own message, anything else (a node lost for good, a dataset Ray gave up
    on) as a failure of the cluster, whose written shards the same command resumes from."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, AttnvizError):
            return AtlasError(str(e))
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return AtlasError(
        f"the Ray cluster gave up on the work ({type(error).__name__}); the shards written are kept: "
        "run the same command again to resume"
    )


def _run_chunk(ray, plan: ActorPlan, checkpoint, sha256, shards, batch_size, precision, on_batch):
    """One chunk's shards through a pool of ``plan``'s actors; (shard, results) as each shard completes."""
    dataset = ray.data.from_items(_rows(shards, batch_size))
    results = dataset.map_batches(
        AtlasWorker,
        fn_constructor_kwargs={
            "checkpoint": str(checkpoint),
            "sha256": sha256,
            "device": plan.device,
            "precision": precision,
            "threads": plan.threads,
        },
        batch_size=1,  # a row is a batch already
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=plan.actors),
        **plan.resources,
    )
    waiting = {shard: len(sentences) for shard, sentences in shards.items()}
    collected: dict[int, dict[int, BatchResult]] = defaultdict(dict)
    for part in results.iter_batches(batch_size=None, batch_format="pandas"):
        for shard, batch, payload in zip(part["shard"], part["batch"], part["payload"], strict=True):
            shard, batch = int(shard), int(batch)
            if shard not in waiting or batch in collected[shard]:  # a retried task's second answer: counted once
                log.warning("batch %d of shard %d came back twice: the second is ignored", batch, shard)
                continue
            result = decode_result(payload)
            collected[shard][batch] = result
            waiting[shard] -= len(result.sentences)
            if on_batch is not None:
                on_batch(len(result.sentences))
            if waiting[shard] == 0:
                del waiting[shard]
                done = collected.pop(shard)
                yield shard, [done[number] for number in sorted(done)]
