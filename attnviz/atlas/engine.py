"""The work of the atlas on one batch of sentences, and the local engine that runs it batch after batch.

`run_batch` is what every engine runs, locally or in a Ray actor: pad a batch of similar
length, decode greedily where no decoder input was given, run the model once for its maps
(`Transformer.attention_maps`: its linear layers on the real tokens, not the padding), and compute
each head's statistics and the head-to-head divergences on the model's device. Only those
small results come back to the host.

``precision="bf16"`` runs the matrix products in bfloat16 under ``torch.autocast``, with the
softmax in float32 (`attnviz.model.attention`; on the CPU the linear layers take oneDNN's
bfloat16 kernel, `attnviz.linear`): on a CPU with AMX or a recent GPU they are several times
faster. The maps move by a few thousandths (``tests/test_atlas_stats.py`` states the bound).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np
import torch

from attnviz.atlas.corpus import Sentence, batch_plan, is_punctuation, special_ids
from attnviz.atlas.stats import js_divergences, sentence_statistics, stack_heads
from attnviz.checkpoints import Bundle
from attnviz.decoding import greedy_decode, output_limit
from attnviz.devices import fast_bfloat16
from attnviz.errors import InputError, NonFiniteError
from attnviz.tokenizer import pad_batch

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class BatchResult:
    """What one batch gives back: its sentences (decoder inputs filled in) and, per kind, numpy arrays.

    ``stats[kind]`` (B, L, H, len(STATISTICS)) float32 and ``divergences[kind]`` (B, N, N) float64,
    in the order of ``sentences``.
    """

    sentences: tuple[Sentence, ...]
    stats: dict[str, np.ndarray]
    divergences: dict[str, np.ndarray]


def check_precision(precision: str, device: torch.device | None) -> None:
    """InputError for a precision of no known name, or bf16 on a device without it; a warning where
    bf16 is emulated. ``device`` None: the name only (Ray's nodes, on CPUs or CUDA GPUs, not this one)."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if device is None:
        return
    if precision == "bf16" and device.type not in ("cpu", "cuda"):
        raise InputError(f"bf16 runs on the CPU or a CUDA GPU, not on {device.type}; use --precision fp32")
    if precision == "bf16":
        _say_if_emulated(device.type)


@cache
def _say_if_emulated(device_type: str) -> None:
    """Warn once per process and device type when bf16 would be emulated there (slower than fp32)."""
    fast, why = fast_bfloat16(torch.device(device_type))
    if not fast:
        log.warning(
            "bf16 on this %s is emulated (%s): slower than fp32, not faster; use --precision fp32", device_type, why
        )


def precision_context(precision: str, device: torch.device) -> AbstractContextManager:
    """Where the model runs at ``precision``: autocast to bfloat16 for "bf16" (softmax stays float32)."""
    check_precision(precision, device)
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def _max_output(bundle: Bundle, src_len: int) -> int:
    return output_limit(src_len, bundle.config.max_len)


def _with_greedy_targets(bundle: Bundle, sentences: list[Sentence], src, src_valid) -> list[Sentence]:
    """The sentences with the model's greedy output as decoder input where none was given."""
    todo = [i for i, s in enumerate(sentences) if s.tgt_ids is None]
    if not todo:
        return sentences
    rows = torch.tensor(todo, device=src.device)
    width = int(src_valid[rows].sum(-1).max())
    limits = [_max_output(bundle, len(sentences[i].src_ids)) for i in todo]
    outputs = greedy_decode(bundle.model, src[rows, :width], src_valid[rows, :width], max_len=max(limits))
    tok, done = bundle.tokenizer, list(sentences)
    for i, out, limit in zip(todo, outputs, limits, strict=True):
        ids = (tok.bos_id, *out[:limit])
        done[i] = replace(sentences[i], tgt_ids=ids, tgt_tokens=tuple(tok.target_token(t) for t in ids))
    return done


def _flags(sequences: list[tuple[int, ...]], tokens: list[tuple[str, ...]], specials, width: int, device):
    """(special, punctuation) key flags (B, width) bool for padded sequences."""
    special = torch.zeros(len(sequences), width, dtype=torch.bool)
    punctuation = torch.zeros(len(sequences), width, dtype=torch.bool)
    for b, (ids, labels) in enumerate(zip(sequences, tokens, strict=True)):
        special[b, : len(ids)] = torch.tensor([i in specials for i in ids], dtype=torch.bool)
        punctuation[b, : len(ids)] = torch.tensor([is_punctuation(t) for t in labels], dtype=torch.bool)
    return special.to(device), punctuation.to(device)


@torch.no_grad()
def run_batch(bundle: Bundle, sentences: Iterable[Sentence], precision: str = "fp32") -> BatchResult:
    """Statistics and divergences of every head for one batch (similar lengths run best), on the model's device."""
    model, tok, device = bundle.model, bundle.tokenizer, bundle.device
    sentences = list(sentences)
    specials = special_ids(tok)
    with precision_context(precision, device):
        src, src_valid = pad_batch([s.src_ids for s in sentences], tok.pad_id, device)
        if bundle.config.decoder_only:  # a language model: its prompts are the decoder's input
            src_flags = _flags(
                [s.src_ids for s in sentences], [s.src_tokens for s in sentences], specials, src.shape[1], device
            )
            attn = model.attention_maps(None, src, None, src_valid)
            return _result(sentences, attn, {"decoder": (src_valid, src_valid, src_flags)})
        if not bundle.config.encoder_only:
            sentences = _with_greedy_targets(bundle, sentences, src, src_valid)
        src_flags = _flags(
            [s.src_ids for s in sentences], [s.src_tokens for s in sentences], specials, src.shape[1], device
        )
        if bundle.config.encoder_only:
            attn = model.attention_maps(src, None, src_valid)
            sides = {"encoder": (src_valid, src_valid, src_flags)}
        else:
            tgt, tgt_valid = pad_batch([s.tgt_ids for s in sentences], tok.pad_id, device)
            tgt_flags = _flags(
                [s.tgt_ids for s in sentences], [s.tgt_tokens for s in sentences], specials, tgt.shape[1], device
            )
            attn = model.attention_maps(src, tgt, src_valid, tgt_valid)
            sides = {
                "encoder": (src_valid, src_valid, src_flags),
                "decoder": (tgt_valid, tgt_valid, tgt_flags),
                "cross": (tgt_valid, src_valid, src_flags),
            }
    return _result(sentences, attn, sides)


def _result(sentences: list[Sentence], attn, sides: dict) -> BatchResult:
    """The statistics and divergences of each kind's maps in ``attn``, with each side's masks and flags."""
    stats, divergences = {}, {}
    for kind, (query_valid, key_valid, (special, punctuation)) in sides.items():
        maps = getattr(attn, kind)
        for m in maps:  # before stack_heads, whose threshold would make NaN a 0; weights sum to at most H * Q
            bad = ~torch.isfinite(m.sum(dim=(1, 2, 3), dtype=torch.float32))  # (B,): one pass, no mask tensor
            if bool(bad.any()):
                line = sentences[int(bad.nonzero()[0, 0])].line
                raise NonFiniteError(
                    f"the {kind} attention of line {line} holds NaN or infinite values: the model's numbers overflow "
                    "for it, so the atlas stops here rather than hold wrong numbers"
                )
        p = stack_heads(maps)  # one float32 copy for both
        stats[kind] = sentence_statistics(maps, kind, query_valid, key_valid, special, punctuation, p).cpu().numpy()
        divergences[kind] = js_divergences(maps, query_valid, p, kind == "decoder", key_valid).cpu().numpy()
    return BatchResult(tuple(sentences), stats, divergences)


def batches_at_once(device: torch.device) -> int:
    """How many batches the local engine runs at the same time on ``device``, each on one torch thread.

    One per torch thread on every CPU: a batch on each core took `bench_atlas.py`'s engine from 9.77 to
    8.75 s on a 2-core AMD EPYC with AVX2 only (Zen 3; 1.12x within repeats), from 4.48-4.76 to 4.14-4.17
    s on a 2-core Intel Xeon with AMX (1.14x and 1.18x in two runs), and 1.20x in two runs on a 2-core AMD
    EPYC with AVX-512 and no AMX (Zen 4; fp32 3.31x and 3.44x the plain loop, against 2.78x and 2.97x one
    batch at a time in the same repeats), with the same results to the bit as one batch at a time on one
    thread. One batch's many small passes (the divergences' blocks, the statistics, the attention) gain
    little from a second thread, whose hand-overs each pays, while two batches share nothing. A GPU runs
    one batch's kernels on the whole device.
    """
    if device.type != "cpu":
        return 1
    return torch.get_num_threads()


def run_tagged(
    bundle: Bundle,
    work: Iterable[tuple[Any, Sequence[Sentence]]],
    precision: str = "fp32",
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[tuple[Any, BatchResult]]:
    """(tag, `run_batch` of the batch) for each (tag, batch) of ``work``, in its order.

    `batches_at_once` batches run at the same time, each in a thread of its own with torch on one
    thread there, so that the maps of that many batches are in memory at once; as many more are
    handed out ahead (their sentences, or their small results once done) so that no thread waits
    for the next. Torch's thread count is the caller's again afterwards. ``on_batch(n)`` is called
    as each batch of n sentences is taken (a progress bar).
    """
    at_once = batches_at_once(bundle.device)
    if at_once <= 1:
        for tag, batch in work:
            result = run_batch(bundle, batch, precision)
            if on_batch is not None:
                on_batch(len(result.sentences))
            yield tag, result
        return

    def one_thread(batch: Sequence[Sentence]) -> BatchResult:
        torch.set_num_threads(1)  # this thread's own OpenMP team (the caller's is set back below)
        return run_batch(bundle, batch, precision)

    threads = torch.get_num_threads()
    pending: deque[tuple[Any, Future]] = deque()
    pool = ThreadPoolExecutor(at_once, thread_name_prefix="atlas-batch")
    try:
        for tag, batch in work:
            pending.append((tag, pool.submit(one_thread, batch)))
            if len(pending) == 2 * at_once:
                yield _taken(pending, on_batch)
        while pending:
            yield _taken(pending, on_batch)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a consumer that stops early: nothing left running
        torch.set_num_threads(threads)


def _taken(pending: deque, on_batch: Callable[[int], None] | None) -> tuple[Any, BatchResult]:
    """The oldest batch's (tag, result), once it is done."""
    tag, future = pending.popleft()
    result = future.result()
    if on_batch is not None:
        on_batch(len(result.sentences))
    return tag, result


def run_local(
    bundle: Bundle,
    sentences: Iterable[Sentence],
    batch_size: int,
    precision: str = "fp32",
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[BatchResult]:
    """The local engine: ``sentences`` sorted by their longer side and run in padded batches
    (`attnviz.atlas.corpus.batch_plan`) on the bundle's device (`run_tagged`).

    ``on_batch(n)`` is called after each batch of n sentences (a progress bar).
    """
    check_precision(precision, bundle.device)
    for _, result in run_tagged(bundle, ((None, b) for b in batch_plan(sentences, batch_size)), precision, on_batch):
        yield result


@torch.no_grad()
def head_map(
    bundle: Bundle, src_ids: Sequence[int], tgt_ids: Sequence[int] | None, kind: str, layer: int, head: int
) -> np.ndarray:
    """One head's map (Q, K) float32 for one sentence's exact inputs, as an atlas's ``inputs.parquet`` holds them.

    ``layer`` and ``head`` count from 1; ``tgt_ids`` is the decoder input (None for an encoder-only model).
    """
    device = bundle.device
    src = torch.tensor([list(src_ids)], device=device)
    tgt = None if tgt_ids is None else torch.tensor([list(tgt_ids)], device=device)
    if bundle.config.decoder_only:  # a language model reads its prompt as the decoder's input
        src, tgt = None, src
    attn = bundle.model(src, tgt, return_attention=True, return_logits=False).attention
    return getattr(attn, kind)[layer - 1][0, head - 1].float().cpu().numpy()
