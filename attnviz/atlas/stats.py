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
  table (:func:`attnviz.analysis.head_statistics`) does. ``next`` is NaN for decoder
  self-attention: the causal mask gives the next key no weight, ever;
- ``first``, ``last``: the weight on the first and on the last real key (``last`` NaN for decoder
  self-attention, where only the last query may see the last key; the explorer calls it ``end``);
- ``special``: the weight on special tokens (start, end and padding ids, and BERT's [CLS], [SEP]);
- ``punctuation``: the weight on keys whose piece is punctuation only (Unicode category P);
- ``confidence``: the largest weight of the row (Voita et al., 2019);
- ``argmax_previous``, ``argmax_next``: the share of rows whose largest weight is on key i - 1
  (i + 1), over the rows that have such a key; self-attention only, and no ``argmax_next`` for the
  decoder. Voita et al. call a head *positional* when at least 90% of the time its largest weight
  is at one relative position, -1 or +1 (:data:`POSITIONAL_SHARE`).

Shape letters: B sentences, L layers, H heads, N = L * H heads of one kind, Q queries, K keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
# Weights below TINY count as 0 (stack_heads), and p ln p is taken as p ln max(p, TINY), 0 for p = 0
# (where 0 * ln 0 would be NaN): no statistic moves by more than about 1e-28, far under float32's
# rounding of the sums. It keeps subnormal numbers (softmax underflow, common in sharp heads) out of
# the arithmetic: on x86 they take a slow microcode path, and a pass of logs over maps with some of
# them took 20x as long as over normal numbers here (46 ms against 2 ms for 1.4 million weights).
TINY = 1e-30
# Elements of one (sentences, heads, Q, K) working buffer of the divergences: about 64 MB in float32.
MAX_BUFFER = 2**24


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

    Weights below TINY are set to 0 in this copy: no statistic moves by more than about 1e-28, and
    every later pass then runs on normal numbers (see TINY).
    """
    p = torch.stack([m.float() for m in maps], dim=1).flatten(1, 2)
    return p.masked_fill_(p < TINY, 0.0)


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
    tokens and punctuation. Statistics a kind does not have (:func:`defined`) are NaN.
    ``stacked``: ``stack_heads(maps)`` when the caller has it already (it is not modified).
    """
    check_kind(kind)
    L, (B, H, Q, K) = len(maps), maps[0].shape
    p = stack_heads(maps) if stacked is None else stacked  # (B, N, Q, K)
    n_queries, n_keys = query_valid.sum(-1), key_valid.sum(-1)  # (B,)
    d = aligned_keys(kind, n_queries, n_keys, Q)  # (B, Q)
    rows = query_valid

    def at_key(offset: int) -> tuple[Tensor, Tensor]:
        """The weight on key d(i) + offset, (B, N, Q), and the rows where that key exists, (B, Q)."""
        key = d + offset
        exists = rows & (key >= 0) & (key < n_keys[:, None])
        index = key.clamp(0, K - 1)[:, None, :, None].expand(B, p.shape[1], Q, 1)
        return p.gather(-1, index)[..., 0], exists

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
        _, exists = at_key(offset)
        values[name] = ((top_key == d[:, None, :] + offset).to(p.dtype), exists)

    has = defined(kind)
    nan = torch.full((B, p.shape[1]), math.nan, device=p.device)
    columns = [_masked_mean(*values[name]) if has[name] else nan for name in STATISTICS]
    return torch.stack(columns, dim=-1).view(B, L, H, len(STATISTICS))


def js_divergences(maps: Sequence[Tensor], query_valid: Tensor, stacked: Tensor | None = None) -> Tensor:
    """Head-to-head Jensen-Shannon divergences per sentence: (B, N, N) float64, on the maps' device.

    Entry (b, m, n) is the mean over sentence b's real query rows of JS(row of head m, row of head
    n) = H((P + Q) / 2) - (H(P) + H(Q)) / 2, in nats (0 to ln 2), with heads numbered layer-major.
    This is Clark et al.'s (2019) distance between heads, averaged over rows where they sum it over
    tokens.

    The work is three elementwise passes per pair of heads (an add, a log, a multiply) in reused
    float32 buffers laid out heads first, so that every slice of heads is contiguous, and a
    matrix-vector product for the row sums; the sums over rows are float64. One operand carries
    TINY already, so s = P + Q + TINY is never 0: s ln s then differs from the exact value by under
    1e-28 per key, and no pass needs a clamp or a test for zero.
    """
    p = stack_heads(maps) if stacked is None else stacked  # (B, N, Q, K); not modified
    B, N, Q, K = p.shape
    out = torch.zeros(B, N, N, dtype=torch.float64, device=p.device)
    chunk = max(1, MAX_BUFFER // max(1, N * Q * K))  # sentences per pass, bounding the buffers
    for lo in range(0, B, chunk):
        part = p[lo : lo + chunk].transpose(0, 1).contiguous()  # (N, b, Q, K)
        rows = query_valid[lo : lo + chunk]
        b = part.shape[1]
        lifted = part + TINY
        mixture, work = torch.empty_like(part), torch.empty_like(part)
        own = -_row_sums(torch.log(lifted, out=work).mul_(part)).double()  # H(P) per row, (N, b, Q)
        mass = _row_sums(part).double()  # 1 per real row, to float32 rounding
        for m in range(N - 1):
            n = N - 1 - m
            s = torch.add(part[m + 1 :], lifted[m : m + 1], out=mixture[:n])  # P + Q + TINY, (n, b, Q, K)
            # H(M) with M = (P + Q) / 2: -sum (s/2) ln(s/2) = -(sum s ln s) / 2 + ln 2 * (sum s) / 2
            sum_slns = _row_sums(torch.log(s, out=work[:n]).mul_(s)).double()
            mixed = -0.5 * sum_slns + 0.5 * math.log(2) * (mass[m : m + 1] + mass[m + 1 :])
            per_row = mixed - 0.5 * (own[m : m + 1] + own[m + 1 :])  # (n, b, Q)
            mean = _masked_mean(per_row.transpose(0, 1), rows).clamp_min(0)  # (b, n); rounding can dip below 0
            out[lo : lo + b, m, m + 1 :] = mean
            out[lo : lo + b, m + 1 :, m] = mean
    return out
