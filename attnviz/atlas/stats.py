"""Each head's habits in a batch of sentences, computed with torch where the maps are, from padding masks.

Input: the per-layer maps of one kind of attention for a padded batch, (B, H, Q, K) each, as the
model returns them (rows are queries, columns keys), and which query rows and key columns hold
real tokens. Output: one number per sentence, layer, head and statistic, and the head-to-head
Jensen-Shannon divergences per sentence. Nothing but those small results leaves the device: the
maps are never copied to the host. Padding is right padding (``attnviz.tokenizer.pad_batch``): the
real tokens of a sentence are its first ``n`` positions; padded query rows are left out of every
mean and padded keys hold zero weight.

Every statistic is a mean over the sentence's real query rows i (those where it is defined):

- ``entropy``: -sum_j a_ij ln a_ij, in nats (0 ln 0 = 0, so masked keys add nothing);
- ``mean_distance``: sum_j a_ij |i - j|, in tokens; self-attention only (NaN for cross-attention,
  where query and key positions count different sentences);
- ``diagonal``, ``previous``, ``next``: the weight on key d(i), d(i) - 1 and d(i) + 1, over the rows
  where that key exists. d(i) = i for self-attention; for cross-attention the query's position is
  scaled onto the source, d(i) = round(i (S - 1) / (T - 1)), rounding halves up, as the explorer's
  table (`attnviz.analysis.head_statistics`) does. ``next`` is NaN for decoder
  self-attention: the causal mask gives the next key no weight, ever;
- ``first``, ``last``: the weight on the first and on the last real key (``last`` NaN for decoder
  self-attention, where only the last query may see the last key; the explorer calls it ``end``);
- ``special``: the weight on special tokens (start, end and padding ids, and BERT's [CLS], [SEP]);
- ``punctuation``: the weight on keys whose piece is punctuation only (Unicode category P);
- ``confidence``: the largest weight of the row (Voita et al., 2019);
- ``argmax_previous``, ``argmax_next``: the share of rows whose largest weight is on key i - 1
  (i + 1), over the rows that have such a key; self-attention only, and no ``argmax_next`` for the
  decoder. Voita et al. call a head *positional* when at least 90% of the time its largest weight
  is at one relative position, -1 or +1 (`POSITIONAL_SHARE`).

Shape letters: B sentences, L layers, H heads, N = L * H heads of one kind, Q queries, K keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from attnviz.kinds import check_kind

STATISTICS = (
    "entropy",
    "mean_distance",
    "diagonal",
    "previous",
    "next",
    "first",
    "last",
    "special",
    "punctuation",
    "confidence",
    "argmax_previous",
    "argmax_next",
)
# Voita et al. (2019), section 5.1: "at least 90% of the time its maximum attention weight is
# assigned to a specific relative position (in practice either -1 or +1)".
POSITIONAL_SHARE = 0.9
# Weights up to TINY count as 0 (stack_heads), and p ln p is taken as p ln max(p, TINY), 0 for p = 0
# (where 0 * ln 0 would be NaN): no statistic moves by more than about 1e-28, far under float32's
# rounding of the sums. It keeps subnormal numbers (softmax underflow, common in sharp heads) out of
# the arithmetic: on x86 they take a slow microcode path, and a pass of logs over maps with some of
# them took 20x as long as over normal numbers here (46 ms against 2 ms for 1.4 million weights).
TINY = 1e-30
# Weights per block of the divergences (all heads): 1 MB in float32, so that the block's few
# buffers stay in the processor's cache. 2**17 to 2**19 ran alike on a 2-core Intel Xeon; 2**20 and
# more ran slower, and whole batches at once (tens of MB) twice as slow.
TILE = 2**18
# On a GPU a block is rather one kernel launch's worth of work: the launches, not the cache, bound it.
GPU_TILE = 2**24
# The divergences sum the weights of a sentence in runs of CHUNK consecutive real cells (see _cells):
# each sentence's cells are padded to a multiple of it, with cells of zero weight.
CHUNK = 32


def defined(kind: str) -> dict[str, bool]:
    """Which statistics ``kind`` has: the others are NaN in every row (see the module's docstring)."""
    self_attention = check_kind(kind) != "cross"
    return {
        **dict.fromkeys(STATISTICS, True),
        "mean_distance": self_attention,
        "next": kind != "decoder",
        "last": kind != "decoder",
        "argmax_previous": self_attention,
        "argmax_next": kind == "encoder",
    }


def _row_sums(x: Tensor) -> Tensor:
    """Sums over the last axis as one matrix-vector product: torch's reduction over a short last
    axis is several times slower on the CPU."""
    ones = torch.ones(x.shape[-1], 1, dtype=x.dtype, device=x.device)
    return (x.reshape(-1, x.shape[-1]) @ ones).view(x.shape[:-1])


def _xlogx_sums(p: Tensor, work: Tensor) -> Tensor:
    """sum_k p ln p over the last axis (0 ln 0 = 0), with ``work`` (contiguous, p's shape) as scratch space."""
    torch.clamp(p, min=TINY, out=work)
    work.log_().mul_(p)
    return _row_sums(work)


def _masked_mean(values: Tensor, rows: Tensor) -> Tensor:
    """Mean of (B, N, Q) ``values`` over the rows where ``rows`` (B, Q) is True: (B, N); NaN where none is."""
    weights = rows.to(values.dtype)[:, None, :]
    return torch.where(rows[:, None, :], values, 0).sum(-1) / weights.sum(-1)


def aligned_keys(kind: str, n_queries: Tensor, n_keys: Tensor, width: int) -> Tensor:
    """d(i) for query positions 0..width-1 of each sentence: (B, width) long.

    i for self-attention; round(i (S - 1) / (T - 1)), halves up, for cross-attention, in integer
    arithmetic so that no rounding of a division can move a half.
    """
    i = torch.arange(width, device=n_queries.device)[None, :]  # (1, Q)
    if kind != "cross":
        return i.expand(n_queries.shape[0], width)
    span_q = (n_queries - 1).clamp_min(1)[:, None]  # T - 1, or 1 for a one-token target (then i = 0)
    return (2 * i * (n_keys[:, None] - 1) + span_q) // (2 * span_q)


def stack_heads(maps: Sequence[Tensor]) -> Tensor:
    """Per-layer maps (B, H, Q, K) as one float32 tensor (B, N, Q, K), layer-major: head n is layer n // H.

    Weights up to TINY are set to 0 in this copy, in one pass: no statistic moves by more than about
    1e-28, and every later pass then runs on normal numbers (see TINY).
    """
    p = torch.stack([m.float() for m in maps], dim=1).flatten(1, 2)
    return torch.threshold_(p, TINY, 0.0)


def sentence_statistics(
    maps: Sequence[Tensor],
    kind: str,
    query_valid: Tensor,
    key_valid: Tensor,
    key_special: Tensor,
    key_punctuation: Tensor,
    stacked: Tensor | None = None,
) -> Tensor:
    """Every statistic of every head for each sentence: (B, L, H, len(STATISTICS)) float32, on the maps' device.

    ``maps``: L tensors (B, H, Q, K); ``query_valid`` (B, Q) and ``key_valid`` (B, K): real tokens
    (a prefix of each row); ``key_special``, ``key_punctuation`` (B, K): which keys are special
    tokens and punctuation. Statistics a kind does not have (`defined`) are NaN.
    ``stacked``: ``stack_heads(maps)`` when the caller has it already (it is not modified).
    """
    check_kind(kind)
    L, (B, H, Q, K) = len(maps), maps[0].shape
    p = stack_heads(maps) if stacked is None else stacked  # (B, N, Q, K)
    n_queries, n_keys = query_valid.sum(-1), key_valid.sum(-1)  # (B,)
    d = aligned_keys(kind, n_queries, n_keys, Q)  # (B, Q)
    rows = query_valid

    def has_key(offset: int) -> Tensor:
        """The rows where key d(i) + offset exists, (B, Q)."""
        key = d + offset
        return rows & (key >= 0) & (key < n_keys[:, None])

    def at_key(offset: int) -> tuple[Tensor, Tensor]:
        """The weight on key d(i) + offset, (B, N, Q), and the rows where that key exists, (B, Q)."""
        index = (d + offset).clamp(0, K - 1)[:, None, :, None].expand(B, p.shape[1], Q, 1)
        return p.gather(-1, index)[..., 0], has_key(offset)

    work = torch.empty_like(p)
    values = {"entropy": (-_xlogx_sums(p, work), rows)}
    if kind != "cross":
        i, j = torch.arange(Q, device=p.device), torch.arange(K, device=p.device)
        distance = (i[:, None] - j[None, :]).abs().to(p.dtype)  # (Q, K)
        values["mean_distance"] = (_row_sums(torch.mul(p, distance, out=work)), rows)
    values["diagonal"] = at_key(0)
    values["previous"] = at_key(-1)
    values["next"] = at_key(1)
    values["first"] = (p[..., 0], rows)
    last = (n_keys - 1).clamp_min(0)[:, None, None, None].expand(B, p.shape[1], Q, 1)
    values["last"] = (p.gather(-1, last)[..., 0], rows)
    flags = torch.stack([key_special, key_punctuation], dim=-1).to(p.dtype)  # (B, K, 2)
    shares = torch.matmul(p, flags[:, None])  # (B, N, Q, 2)
    values["special"] = (shares[..., 0], rows)
    values["punctuation"] = (shares[..., 1], rows)
    top, top_key = p.max(dim=-1)  # (B, N, Q)
    values["confidence"] = (top, rows)
    for name, offset in (("argmax_previous", -1), ("argmax_next", 1)):
        values[name] = ((top_key == d[:, None, :] + offset).to(p.dtype), has_key(offset))

    has = defined(kind)
    nan = torch.full((B, p.shape[1]), math.nan, device=p.device)
    columns = [_masked_mean(*values[name]) if has[name] else nan for name in STATISTICS]
    return torch.stack(columns, dim=-1).view(B, L, H, len(STATISTICS))


def _cells(query_valid: Tensor, key_valid: Tensor | None, K: int, causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Where the divergences read: (cells, pads, owners) over the real cells of every sentence, in order.

    ``cells`` (E,) long: each real cell's offset in one head's (B, Q, K) maps laid out as in a
    (B, N, Q, K) tensor (``b * N * Q * K`` is added by the caller, which knows N), sentence after
    sentence, row after row; a real cell is a real query row and a real key, and, under ``causal``,
    a key not after the query (the others hold no weight). Each sentence's run is padded to a
    multiple of CHUNK with copies of its first cell, whose places are ``pads`` (they are set to 0),
    so that run ``c`` of CHUNK cells belongs to sentence ``owners[c]``. Without ``key_valid`` every
    key is read (a padded key's weight is 0 anyway).
    """
    device = query_valid.device
    n_queries = query_valid.sum(-1).tolist()
    n_keys = [K] * len(n_queries) if key_valid is None else key_valid.sum(-1).tolist()
    cells, pads, owners, at = [], [], [], 0
    for b, (nq, nk) in enumerate(zip(n_queries, n_keys, strict=True)):
        if causal:
            rows, keys = torch.tril_indices(nq, min(nq, nk), device=device)
            run = rows * K + keys
        else:
            run = (torch.arange(nq, device=device)[:, None] * K + torch.arange(nk, device=device)).flatten()
        if not len(run):
            continue
        extra = -len(run) % CHUNK
        pads.append(torch.arange(at + len(run), at + len(run) + extra, device=device))
        run = torch.cat([run, run[:1].expand(extra)]) if extra else run
        cells.append(run)
        owners.append(torch.full((len(run) // CHUNK,), b, device=device))
        at += len(run)
    if not cells:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return empty, empty, empty
    return torch.cat(cells), torch.cat(pads), torch.cat(owners)


# Which float32 logarithm the divergences take on the CPU: numpy's where the processor has AVX-512, torch's
# elsewhere. Neither wins everywhere: on a 2-core AMD EPYC with AVX-512 numpy's took 0.24 ns a value and
# torch's 0.77 (one thread) or 0.40 (two); on a 2-core AMD EPYC with AVX2 only (Zen 3) numpy's took 1.9 ns
# and torch's 1.4 (one thread) or 1.05 (two); on a 2-core Intel Xeon with AMX numpy's took 0.44 ns and
# torch's 0.31 (one thread) or 0.13 (two), yet the divergences of a batch on one thread (as every CPU runs
# its batches, `engine.batches_at_once`) took 0.080 s with numpy's and 0.074 with torch's, about 2% of
# the engine's 3.6 s on bench_atlas.py's corpus (three kinds of map, two cores): left to numpy's there.
# The choice follows the processor, not a timing: the two differ in the last bit of some values, and a
# choice timed afresh in each process flipped on a busy machine, so that an atlas killed and resumed mixed
# both and its divergences differed from one run straight through
# (`test_the_command_killed_with_sigkill_resumes_and_loses_nothing`).
def _uses_numpy_log() -> bool:
    """Whether the divergences take numpy's float32 logarithm: where torch's CPU kernels run AVX-512."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _log(x: Tensor, out: Tensor) -> Tensor:
    """ln ``x`` written into ``out`` (same shape, float32), returned.

    On the CPU with numpy's float32 logarithm where the processor has AVX-512 (`_uses_numpy_log`): both are
    within 7e-8 of the float64 logarithm, and their speeds differ by up to 3x either way between CPUs.
    The divergences take one for every pair of heads and real cell, the engine's largest cost after the
    model. Splitting a block over two threads lost more to the hand-over than it gained.
    """
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad or not _uses_numpy_log():
        return torch.log(x, out=out)
    np.log(x.numpy(), out=out.numpy())
    return out


def js_divergences(
    maps: Sequence[Tensor],
    query_valid: Tensor,
    stacked: Tensor | None = None,
    causal: bool = False,
    key_valid: Tensor | None = None,
) -> Tensor:
    """Head-to-head Jensen-Shannon divergences per sentence: (B, N, N) float64, on the maps' device.

    Entry (b, m, n) is the mean over sentence b's real query rows of JS(row of head m, row of head
    n) = H((P + Q) / 2) - (H(P) + H(Q)) / 2, in nats (0 to ln 2), with heads numbered layer-major.
    This is Clark et al.'s (2019) distance between heads, averaged over rows where they sum it over
    tokens. ``causal``: the maps are causally masked (decoder self-attention), so that keys after a
    query hold no weight; ``key_valid`` (B, K): which keys are real. Only the real cells are read
    (`_cells`): real rows, real keys, and under ``causal`` no key after its query. Padding held
    30% to 50% more cells than that in the benchmark's batches, and a causal map twice as many.

    H(M) = ln 2 (mass P + mass Q) / 2 - (sum s ln s) / 2 with s = P + Q: the one term that needs
    every pair is sum s ln s, one add, one log, one multiply and a matrix-vector product for the sums
    per pair of heads and cell, and everything else is per head. Only sums over a whole sentence
    are needed, not over a row, so the real cells of the batch are gathered into one stream, head by
    head, and the work runs in blocks of about TILE weights of it that stay in the processor's cache
    (GPU_TILE on a GPU). The pairs form by shifts: the block's heads are stored twice over, x =
    [heads 0..N-1, heads 0..N-1], so that one add of x[0:N] and x[d:d+N] forms the pairs (m, m + d
    mod N) of every head m, and the shifts d = 1..N/2 make every pair once (half of the heads for d =
    N/2 when N is even). Sums over runs of CHUNK cells are float32, their sums per sentence float64.
    Every weight carries TINY, so s is never 0: s ln s and p ln p then differ from the exact values by
    under 1e-28 per cell, and no pass needs a clamp or a test for zero.
    """
    p = stack_heads(maps) if stacked is None else stacked  # (B, N, Q, K); not modified
    B, N, Q, K = p.shape
    device = p.device
    shifts = [(d, N - d if 2 * d == N else N) for d in range(1, N // 2 + 1)]  # (shift, heads that pair by it)
    first = torch.tensor([m for _, h in shifts for m in range(h)], dtype=torch.long, device=device)  # pair m, n
    second = torch.tensor([(m + d) % N for d, h in shifts for m in range(h)], dtype=torch.long, device=device)
    cells, pads, owners = _cells(query_valid, key_valid, K, causal)  # (E,), E a multiple of CHUNK
    cells += (owners * (N * Q * K)).repeat_interleave(CHUNK)  # offsets in head 0 of p
    # Cell e of head n is element cells[e] + n Q K of the flat maps. (An index_select along a strided
    # (N, ...) view of them copies the whole batch on every block: the engine took 13x as long.)
    flat = p.contiguous().view(-1)
    head_at = torch.arange(N, device=device)[:, None] * (Q * K)  # (N, 1)
    size = max(CHUNK, (TILE if device.type == "cpu" else GPU_TILE) // N // CHUNK * CHUNK)  # cells per block
    size = min(size, len(cells))
    twice, mixture, work = (torch.empty(n * size, device=device) for n in (2 * N, N, N))
    index = torch.empty(N * size, dtype=torch.long, device=device)
    sums = torch.empty(len(first) * size // CHUNK, device=device)  # sums of s ln s over runs of cells
    slns = torch.zeros(len(first), B, dtype=torch.float64, device=device)  # sum s ln s per pair and sentence
    base = torch.zeros(N, B, dtype=torch.float64, device=device)  # (ln 2 mass + sum p ln p) / 2 per head
    ones = torch.ones(CHUNK, 1, device=device)
    for lo in range(0, len(cells), size):
        hi = min(len(cells), lo + size)
        E, runs, owner = hi - lo, (hi - lo) // CHUNK, owners[lo // CHUNK : hi // CHUNK]
        x = twice[: 2 * N * E].view(2 * N, E)
        where = torch.add(head_at, cells[lo:hi], out=index[: N * E].view(N, E))
        torch.index_select(flat, 0, where.view(-1), out=x[:N].view(-1))
        block_pads = pads[(pads >= lo) & (pads < hi)] - lo
        if len(block_pads):
            x[:N].index_fill_(1, block_pads, 0.0)
        x[:N] += TINY
        plnp = _log(x[:N], work[: N * E].view(N, E)).mul_(x[:N])
        per_run = (0.5 * math.log(2)) * (x[:N].reshape(-1, CHUNK) @ ones) + 0.5 * (plnp.view(-1, CHUNK) @ ones)
        base.index_add_(1, owner, per_run.view(N, runs).double())
        x[N:] = x[:N]
        at = 0
        for d, h in shifts:
            n = h * E
            s = torch.add(x[:h], x[d : d + h], out=mixture[:n].view(h, E))
            w = _log(s, work[:n].view(h, E)).mul_(s)
            torch.mm(w.view(-1, CHUNK), ones, out=sums[at : at + h * runs].view(-1, 1))
            at += h * runs
        slns.index_add_(1, owner, sums[:at].view(-1, runs).double())
    count = query_valid.sum(-1).to(torch.float64)  # (B,)
    mean = ((base[first] + base[second] - 0.5 * slns) / count).clamp_min(0).T  # (B, pairs); rounding can dip below 0
    out = torch.zeros(B, N, N, dtype=torch.float64, device=device)
    out[:, first, second] = mean
    out[:, second, first] = mean
    return out
