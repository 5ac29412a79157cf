"""The Ray engine: the atlas's batches as Ray Data batch inference, the model held by actors.

The driver reads and tokenises the corpus and cuts it into shards exactly as the local engine
does; Ray Data then streams the sentences (sorted by length) through ``map_batches`` into a pool
of :class:`AtlasWorker` actors, each loading the model once and running
:func:`attnviz.atlas.engine.run_batch`, the very function of the local engine. Results come back
as bytes (numpy arrays and JSON, no pickle) and the driver writes each shard as soon as all its
sentences are in.

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

from attnviz.atlas.corpus import Sentence, by_length
from attnviz.atlas.engine import BatchResult, run_batch
from attnviz.checkpoints import load_checkpoint
from attnviz.errors import AtlasError

CPUS_PER_ACTOR = 4  # torch threads per CPU actor: fewer, larger actors hold fewer copies of the model
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def encode_result(result: BatchResult) -> bytes:
    """A BatchResult as .npz bytes: arrays, and the sentences as JSON. Never pickled."""
    arrays = {f"stats/{k}": v for k, v in result.stats.items()}
    arrays |= {f"divergences/{k}": v for k, v in result.divergences.items()}
    sentences = [[s.line, s.src, s.src_ids, s.src_tokens, s.tgt_ids, s.tgt_tokens] for s in result.sentences]
    arrays["sentences"] = np.array(json.dumps(sentences, ensure_ascii=False))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_result(data: bytes) -> BatchResult:
    def tuple_or_none(x):
        return None if x is None else tuple(x)

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        sentences = tuple(
            Sentence(line, src, tuple(ids), tuple(tokens), tuple_or_none(tgt_ids), tuple_or_none(tgt_tokens))
            for line, src, ids, tokens, tgt_ids, tgt_tokens in json.loads(str(z["sentences"]))
        )
        stats = {name.split("/", 1)[1]: z[name] for name in z.files if name.startswith("stats/")}
        divergences = {name.split("/", 1)[1]: z[name] for name in z.files if name.startswith("divergences/")}
    return BatchResult(sentences, stats, divergences)


def subset(result: BatchResult, rows: Sequence[int]) -> BatchResult:
    """The rows (sentences) ``rows`` of a batch's result."""
    index = np.asarray(rows, dtype=np.int64)
    return BatchResult(
        tuple(result.sentences[i] for i in rows),
        {k: v[index] for k, v in result.stats.items()},
        {k: v[index] for k, v in result.divergences.items()},
    )


def _rows(shards: dict[int, Sequence[Sentence]]) -> list[dict]:
    """One dataset row per sentence, its shard's number with it; sorted by length, as the local engine runs them."""
    order = {s.line: shard for shard, sentences in shards.items() for s in sentences}
    return [
        {
            "shard": order[s.line],
            "line": s.line,
            "src": s.src,
            "src_ids": list(s.src_ids),
            "src_tokens": list(s.src_tokens),
            "has_tgt": s.tgt_ids is not None,
            "tgt_ids": list(s.tgt_ids or ()),
            "tgt_tokens": list(s.tgt_tokens or ()),
        }
        for s in by_length(s for sentences in shards.values() for s in sentences)
    ]


class AtlasWorker:
    """A Ray actor holding one copy of the model; called by ``map_batches`` with batches of sentence rows."""

    def __init__(self, checkpoint: str, sha256: str, device: str, precision: str, threads: int):
        torch.set_num_threads(threads)
        self.bundle = load_checkpoint(checkpoint, device)
        if self.bundle.sha256 != sha256:
            raise AtlasError(
                f"the model folder {checkpoint} on this node is not the driver's (checkpoint hash differs): "
                "every node must see the same model"
            )
        self.precision = precision

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        sentences = [
            Sentence(
                int(row.line),
                str(row.src),
                tuple(int(i) for i in row.src_ids),
                tuple(str(t) for t in row.src_tokens),
                tuple(int(i) for i in row.tgt_ids) if row.has_tgt else None,
                tuple(str(t) for t in row.tgt_tokens) if row.has_tgt else None,
            )
            for row in batch.itertuples(index=False)
        ]
        result = run_batch(self.bundle, sentences, self.precision)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, shard in enumerate(batch["shard"]):
            groups[int(shard)].append(i)
        return pd.DataFrame(
            {
                "shard": list(groups),
                "payload": [encode_result(subset(result, rows)) for rows in groups.values()],
            }
        )


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
        dataset = ray.data.from_items(_rows(shards))
        results = dataset.map_batches(
            AtlasWorker,
            fn_constructor_kwargs={
                "checkpoint": str(checkpoint),
                "sha256": sha256,
                "device": "cuda" if "num_gpus" in resources else "cpu",
                "precision": precision,
                "threads": threads,
            },
            batch_size=batch_size,
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
