"""The Ray engine: the atlas's batches as Ray Data batch inference, the model held by actors.

The driver reads and tokenises the corpus and cuts it into shards and batches exactly as the
local engine does (`attnviz.atlas.corpus.batch_plan`, padding kept small); Ray Data then
streams the batches, one dataset row each, through ``map_batches`` into a pool of
`AtlasWorker` actors, each loading the model once and running
`attnviz.atlas.engine.run_batch`, the very function of the local engine, on the very same
batches. Results come back as bytes (numpy arrays and JSON, no pickle) and the driver writes each
shard as soon as all its batches are in.

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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.atlas.corpus import Sentence, batch_plan
from attnviz.atlas.engine import BatchResult, run_batch
from attnviz.checkpoints import load_checkpoint
from attnviz.errors import AtlasError

CPUS_PER_ACTOR = 4  # torch threads per CPU actor: fewer, larger actors hold fewer copies of the model
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


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
    """One dataset row per batch, with its shard's number: the local engine's batches (run_local)."""
    return [
        {"shard": shard, "sentences": _sentences_json(batch)}
        for shard, sentences in shards.items()
        for batch in batch_plan(sentences, batch_size)
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
        return pd.DataFrame({"shard": rows["shard"].to_numpy(), "payload": [encode_result(r) for r in results]})


def _actor_resources(device: str) -> tuple[dict, int, int]:
    """(ray resources per actor, how many actors, torch threads per actor) for the cluster Ray sees."""
    import ray

    cluster = ray.cluster_resources()
    gpus, cpus = int(cluster.get("GPU", 0)), max(1, int(cluster.get("CPU", 1)))
    if device in ("cuda", "auto") and gpus:
        return {"num_gpus": 1, "num_cpus": 1}, gpus, 1
    if device == "cuda":
        raise AtlasError("--device cuda was asked for but the Ray cluster has no GPU; use --device cpu or auto")
    per_actor = min(CPUS_PER_ACTOR, cpus)
    return {"num_cpus": per_actor}, max(1, cpus // per_actor), per_actor


def run_ray(
    checkpoint: Path,
    sha256: str,
    shards: dict[int, Sequence[Sentence]],
    batch_size: int,
    precision: str,
    device: str,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, list[BatchResult]]]:
    """(shard number, its batches' results) for every shard in ``shards``, as each one completes."""
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
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # its plan and timings; failures still raise
        ray.data.DataContext.get_current().enable_progress_bars = False  # the CLI draws its own
        resources, actors, threads = _actor_resources(device)
        dataset = ray.data.from_items(_rows(shards, batch_size))
        results = dataset.map_batches(
            AtlasWorker,
            fn_constructor_kwargs={
                "checkpoint": str(checkpoint),
                "sha256": sha256,
                "device": "cuda" if "num_gpus" in resources else "cpu",
                "precision": precision,
                "threads": threads,
            },
            batch_size=1,  # a row is a batch already
            batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=actors),
            **resources,
        )
        waiting = {shard: len(sentences) for shard, sentences in shards.items()}
        collected: dict[int, list[BatchResult]] = defaultdict(list)
        for part in results.iter_batches(batch_size=None, batch_format="pandas"):
            for shard, payload in zip(part["shard"], part["payload"], strict=True):
                result = decode_result(payload)
                shard = int(shard)
                collected[shard].append(result)
                waiting[shard] -= len(result.sentences)
                if on_batch is not None:
                    on_batch(len(result.sentences))
                if waiting[shard] == 0:
                    yield shard, collected.pop(shard)
    finally:
        if started:
            ray.shutdown()
