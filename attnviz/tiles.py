"""Attention maps computed tile by tile from the queries and keys, for texts whose maps do not fit in memory.

One head of a language model at 8192 tokens is 67 million weights (256 MB of float32); every head
of SmolLM2-135M there is 69 GB. What fixes them is much smaller: each head's queries and keys,
(T, d_head) each, 2 MB at d_head 64. A weight is

```text
A[i, j] = exp(q_i . k_j / sqrt(d_k) - lse_i),
lse_i = log sum_j' exp(q_i . k_j' / sqrt(d_k))
```

(equation 1, with the softmax's normaliser as a log-sum-exp), so one pass over blocks of query
rows gives every row's ``lse`` and, from then on, any tile of the map costs only its own cells.
[`scan`][attnviz.tiles.scan] makes that pass and, on the way, everything a whole map is needed for: the head's
statistics (`attnviz.analysis.head_statistics`, the same definitions) and its maxima over blocks of columns, from which
a max-pooled picture of any size follows ([`pooled_from_scan`][attnviz.tiles.pooled_from_scan]).
[`region`][attnviz.tiles.region] pools any rectangle of the map to a given size, and [`tile`][attnviz.tiles.tile] gives
its exact weights. Nothing holds more than one block of rows of the map at a time.

The arithmetic is float32 torch, as the model's own: weights agree with the model's maps to about
1e-7 (``tests/test_tiles.py`` checks every function against the maps the model returns). Masks are
the two a single unpadded text has: causal (decoder self-attention) or none (encoder
self-attention, cross-attention).

Shape letters: Q queries, K keys, D d_head, R rows of a block, L layers, H heads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attnviz.analysis import DISTANCE_NOTES, aligned_keys, induction_targets
from attnviz.errors import NonFiniteError
from attnviz.export import kind_tokens, written
from attnviz.kinds import KINDS, check_kind

BLOCK_ELEMENTS = 1 << 20  # scores per block of query rows (4 MB of float32): a block stays in the CPU's cache
STATISTICS = ("entropy", "entropy_norm", "mean_distance", "diagonal", "previous", "first", "end", "bos", "induction")


@dataclass(frozen=True)
class HeadQK:
    """What fixes one head's map: its queries and keys as the scores use them (rotated, for RoPE)."""

    queries: np.ndarray  # (Q, D) float32
    keys: np.ndarray  # (K, D) float32
    causal: bool  # decoder self-attention: query i sees keys 0..i

    def __post_init__(self):
        if self.queries.ndim != 2 or self.keys.ndim != 2 or self.queries.shape[1] != self.keys.shape[1]:
            raise ValueError(
                f"queries (Q, D) and keys (K, D) must share D; got {self.queries.shape}, {self.keys.shape}"
            )
        if self.causal and self.queries.shape[0] != self.keys.shape[0]:
            raise ValueError("a causal map is square: as many queries as keys")

    @property
    def shape(self) -> tuple[int, int]:
        return self.queries.shape[0], self.keys.shape[0]

    @property
    def scale(self) -> float:
        return self.queries.shape[1] ** -0.5  # 1 / sqrt(d_k)

    def reach(self, stop: int) -> int:
        """One past the last key that any query before ``stop`` may see."""
        return min(stop, self.shape[1]) if self.causal else self.shape[1]


def _tensor(array: np.ndarray) -> Tensor:
    """``array`` as a tensor; a copy of one made read-only (the app shares results between sessions), which
    torch cannot wrap as it is (a few MB at most, against a pass over a map)."""
    return torch.from_numpy(np.ascontiguousarray(array) if array.flags.writeable else array.copy())


def _tensors(head: HeadQK) -> tuple[Tensor, Tensor]:
    return _tensor(head.queries), _tensor(head.keys)


def _scores(head: HeadQK, q: Tensor, k: Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> Tensor:
    """Scaled scores of ``rows`` x ``cols`` (half-open ranges), -inf where the causal mask blocks them."""
    (r0, r1), (c0, c1) = rows, cols
    scores = torch.mm(q[r0:r1], k[c0:c1].T).mul_(head.scale)
    if head.causal and c1 - 1 > r0:  # some cell above the diagonal
        later = torch.arange(c0, c1)[None, :] > torch.arange(r0, r1)[:, None]
        scores.masked_fill_(later, float("-inf"))
    return scores


def _row_blocks(head: HeadQK) -> tuple[range, int]:
    """(the first row of each block, rows per block): blocks of about BLOCK_ELEMENTS scores."""
    rows = max(1, BLOCK_ELEMENTS // max(1, head.shape[1]))
    return range(0, head.shape[0], rows), rows


@dataclass(frozen=True)
class Scan:
    """One pass over a head's map: each row's normaliser and largest weight, statistics, column-block maxima."""

    lse: np.ndarray  # (Q,) float32: log sum_j exp(score[i, j])
    row_max: np.ndarray  # (Q,) float32: the largest weight of each row
    rows: dict[str, np.ndarray]  # per query row: entropy, distance, the weight on chosen keys (float64); {} without
    column_maxima: np.ndarray | None  # (Q, ceil(K / column_block)) float32: each row's largest weight per block


def _weights_at(head: HeadQK, lse: np.ndarray, rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """A[rows[n], keys[n]] from the rows' normalisers ``lse``, float64 (0 where the mask blocks them)."""
    q, k = head.queries[rows].astype(np.float64), head.keys[keys].astype(np.float64)
    weights = np.exp((q * k).sum(-1) * head.scale - lse[rows])
    return np.where(head.causal & (keys > rows), 0.0, weights)


def scan(
    head: HeadQK,
    kind: str,
    column_block: int | None = None,
    tokens: Sequence[str] | None = None,
    statistics: bool = True,
) -> Scan:
    """Every row's normaliser, largest weight and statistics in one pass over blocks of rows.

    With ``column_block``, also each row's largest weight in each block of that many columns: the
    makings of max-pooled pictures ([`pooled_from_scan`][attnviz.tiles.pooled_from_scan]). The statistics per row are
    those `attnviz.analysis.head_statistics` averages, with the same definitions; ``induction``
    needs the query ``tokens`` (without them it is NaN). ``statistics=False`` leaves them out
    (``rows`` is empty): about half the work, for a picture that needs only the normalisers.

    NonFiniteError when a row's normaliser is not a finite number: its queries times its keys overflow
    float32 (or hold NaN), and every weight of the row would be NaN, drawn as zeros.
    """
    check_kind(kind)
    if head.causal != (kind == "decoder"):
        raise ValueError("decoder self-attention is causal, the other kinds are not")
    Q, K = head.shape
    q, k = _tensors(head)
    lse, row_max = torch.empty(Q), torch.empty(Q)
    entropy, distance = torch.empty(Q, dtype=torch.float64), torch.empty(Q, dtype=torch.float64)
    n_blocks = math.ceil(K / column_block) if column_block else 0
    maxima = torch.zeros(Q, n_blocks) if column_block else None  # blocks past a causal row's reach: weight 0
    aligned = torch.from_numpy(aligned_keys(Q, K, kind).astype(np.float32))
    key_at = torch.arange(K, dtype=torch.float32)
    starts, size = _row_blocks(head)
    for r0 in starts:
        r1 = min(Q, r0 + size)
        hi = head.reach(r1)
        scores = _scores(head, q, k, (r0, r1), (0, hi))  # (R, hi)
        block_lse = torch.logsumexp(scores, dim=-1)  # (R,)
        broken = ~torch.isfinite(block_lse)
        if broken.any():
            row = r0 + int(broken.nonzero()[0, 0])
            raise NonFiniteError(
                f"the {kind} scores of query row {row} (from 0) are not finite numbers (its query times the keys "
                "overflows float32, or holds NaN), so nothing is drawn rather than a wrong picture"
            )
        lse[r0:r1] = block_lse
        if maxima is None:
            top = scores.amax(dim=-1)
        else:  # the blocks' maxima first, and the row's from them: one pass over the scores, not two
            block_max = _column_block_max(scores, column_block)  # (R, ceil(hi / column_block))
            top = block_max.amax(dim=-1)
            maxima[r0:r1, : block_max.shape[1]] = torch.exp(block_max - block_lse[:, None])
        row_max[r0:r1] = torch.exp(top - block_lse)
        if statistics:
            weights = torch.exp(scores - block_lse[:, None])  # 0 where masked (exp(-inf))
            finite = torch.where(torch.isfinite(scores), scores, 0.0)
            # -sum p log p = lse - sum p s, since log p = s - lse
            entropy[r0:r1] = (block_lse - (weights * finite).sum(-1)).double()
            distance[r0:r1] = (weights * (aligned[r0:r1, None] - key_at[None, :hi]).abs_()).sum(-1).double()
    lse_np = lse.numpy()
    rows = _row_statistics(head, kind, lse_np, entropy.numpy(), distance.numpy(), tokens) if statistics else {}
    maxima_np = None if maxima is None else maxima.numpy()
    return Scan(lse_np, row_max.numpy(), rows, maxima_np)


def _column_block_max(scores: Tensor, column_block: int) -> Tensor:
    """(R, ceil(C / column_block)): the largest of each block of ``column_block`` columns of (R, C) ``scores``
    (the last block may be short)."""
    R, C = scores.shape
    whole = C // column_block * column_block
    out = torch.empty(R, math.ceil(C / column_block))
    if whole:
        out[:, : whole // column_block] = scores[:, :whole].unflatten(1, (-1, column_block)).amax(-1)
    if whole < C:
        out[:, -1] = scores[:, whole:].amax(-1)
    return out


def _row_statistics(
    head: HeadQK, kind: str, lse: np.ndarray, entropy: np.ndarray, distance: np.ndarray, tokens: Sequence[str] | None
) -> dict:
    """The per-row quantities of `attnviz.analysis.head_statistics`, from a scan's sums."""
    Q, K = head.shape
    at = np.arange(Q)
    allowed = (at + 1) if kind == "decoder" else np.full(Q, K)
    log_allowed = np.log(allowed.astype(np.float64))
    diagonal_key = np.floor(aligned_keys(Q, K, kind) + 0.5).astype(int)
    previous = _weights_at(head, lse, at, np.maximum(diagonal_key - 1, 0))
    first = _weights_at(head, lse, at, np.zeros(Q, dtype=int))
    none = np.full(Q, np.nan)
    return {
        "entropy": entropy,
        "entropy_norm": np.divide(entropy, log_allowed, out=np.zeros_like(entropy), where=allowed > 1),
        "mean_distance": distance,
        "diagonal": _weights_at(head, lse, at, diagonal_key),
        "previous": np.where(diagonal_key >= 1, previous, np.nan),
        "first": first,
        "end": none if kind == "decoder" else _weights_at(head, lse, at, np.full(Q, K - 1)),
        "bos": first if kind == "decoder" else none,
        "induction": _induction(head, lse, tokens) if kind == "decoder" and tokens is not None else none,
    }


def _induction(head: HeadQK, lse: np.ndarray, tokens: Sequence[str]) -> np.ndarray:
    """Per query row, the weight on the token after its token's latest earlier occurrence; NaN where none."""
    rows, keys = induction_targets(tokens)
    per_row = np.full(head.shape[0], np.nan)
    per_row[rows] = _weights_at(head, lse, rows, keys)
    return per_row


def statistics_row(scanned: Scan) -> dict[str, float]:
    """One head's statistics: the mean of each per-row quantity over the rows that have it (NaN: none)."""
    means = {}
    for name in STATISTICS:
        values = scanned.rows[name]
        means[name] = float(np.nanmean(values)) if np.isfinite(values).any() else np.nan
    return means


def tile(head: HeadQK, scanned: Scan, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
    """The exact weights of rows [r0, r1) and columns [c0, c1), float32 (0 where masked)."""
    (r0, r1), (c0, c1) = rows, cols
    Q, K = head.shape
    if not (0 <= r0 < r1 <= Q and 0 <= c0 < c1 <= K):
        raise ValueError(f"a tile of a {Q} x {K} map needs 0 <= start < stop <= length; got rows {rows}, cols {cols}")
    q, k = _tensors(head)
    scores = _scores(head, q, k, rows, cols)
    return torch.exp(scores - _tensor(scanned.lse[r0:r1])[:, None]).numpy()


def _pool_rows(values: Tensor, block: int) -> Tensor:
    """Max over consecutive groups of ``block`` rows of (R, C) ``values`` (the last group may be short)."""
    R = values.shape[0]
    n = math.ceil(R / block)
    padded = torch.full((n * block, values.shape[1]), float("-inf"), dtype=values.dtype)
    padded[:R] = values
    return padded.view(n, block, -1).amax(1)


def pooled_from_scan(scanned: Scan, row_block: int, per_row_max: bool = False) -> np.ndarray:
    """The map max-pooled over blocks of ``row_block`` rows and the scan's column blocks, float32.

    Each cell is the largest weight of its block (of weight / its row's largest weight, with
    ``per_row_max``); a block whose every cell is masked is 0 ([`allowed_blocks`][attnviz.tiles.allowed_blocks] tells
    them).
    """
    if scanned.column_maxima is None:
        raise ValueError("this scan kept no column-block maxima: scan(..., column_block=n)")
    values = _tensor(scanned.column_maxima)
    if per_row_max:
        values = values / _tensor(scanned.row_max)[:, None]
    return _pool_rows(values, row_block).numpy()


def block_size(length: int, pixels: int) -> int:
    """Positions per pixel so that ``length`` positions fit in at most ``pixels`` pixels."""
    return max(1, math.ceil(length / max(1, pixels)))


def region(
    head: HeadQK,
    scanned: Scan,
    rows: tuple[int, int],
    cols: tuple[int, int],
    pixels: int,
    per_row_max: bool = False,
) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Rows [r0, r1) x columns [c0, c1) of the map, max-pooled to at most ``pixels`` per axis.

    Returns ``(values, allowed, (row_block, column_block))``: ``values`` (h, w) float32 is the
    largest weight of each block (weight / its row's largest weight with ``per_row_max``), and
    ``allowed`` (h, w) says whether any cell of the block may be non-zero (False: every cell is
    masked). Block (i, j) covers rows r0 + i*row_block .. and columns c0 + j*column_block ..
    """
    (r0, r1), (c0, c1) = rows, cols
    Q, K = head.shape
    if not (0 <= r0 < r1 <= Q and 0 <= c0 < c1 <= K):
        raise ValueError(f"a region of a {Q} x {K} map needs 0 <= start < stop <= length; got {rows}, {cols}")
    fr, fc = block_size(r1 - r0, pixels), block_size(c1 - c0, pixels)
    h, w = math.ceil((r1 - r0) / fr), math.ceil((c1 - c0) / fc)
    q, k = _tensors(head)
    lse, row_max = _tensor(scanned.lse), _tensor(scanned.row_max)
    out = torch.empty(h, w)
    step = max(fr, (BLOCK_ELEMENTS // max(1, c1 - c0)) // fr * fr)  # whole row blocks, about a cache's worth
    for start in range(r0, r1, step):
        stop = min(r1, start + step)
        hi = min(c1, head.reach(stop))
        block = torch.zeros(stop - start, w * fc)  # masked cells and the padding: weight 0
        if hi > c0:
            weights = torch.exp(_scores(head, q, k, (start, stop), (c0, hi)) - lse[start:stop, None])
            if per_row_max:
                weights /= row_max[start:stop, None]
            block[:, : hi - c0] = weights
        pooled = block.view(stop - start, w, fc).amax(-1)
        first = (start - r0) // fr
        out[first : first + math.ceil((stop - start) / fr)] = _pool_rows(pooled, fr)
    return out.numpy(), allowed_blocks(head.causal, rows, cols, (fr, fc)), (fr, fc)


def allowed_blocks(causal: bool, rows: tuple[int, int], cols: tuple[int, int], blocks: tuple[int, int]) -> np.ndarray:
    """(h, w) bool: whether any cell of each block of a pooled region may be non-zero (causal: any key <= query)."""
    (r0, r1), (c0, c1), (fr, fc) = rows, cols, blocks
    h, w = math.ceil((r1 - r0) / fr), math.ceil((c1 - c0) / fc)
    if not causal:
        return np.ones((h, w), dtype=bool)
    row_last = np.minimum(r0 + (np.arange(h) + 1) * fr, r1) - 1  # the last row of each block
    col_first = c0 + np.arange(w) * fc
    return col_first[None, :] <= row_last[:, None]


# ---------------------------------------------------------------------------------------------
# Every head of a text


@dataclass(frozen=True)
class LayerTiles:
    """One layer of one kind: each head's queries, keys and [`Scan`][attnviz.tiles.Scan] (normalisers and statistics),
    and each head's thumbnail. What the app fetches per layer."""

    kind: str
    layer: int  # from 1
    heads: tuple[HeadQK, ...]
    scans: tuple[Scan, ...]  # without column maxima: the thumbnails hold what the grid needs of them
    thumbnails: np.ndarray  # (H, 2, h, w) float32: each head max-pooled, [0] weights, [1] weight / row max
    blocks: tuple[int, int]  # positions per thumbnail pixel: (rows, columns)
    labels: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...] | None]  # query and key tokens, what rows write

    def tokens(self, kind: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(query tokens, key tokens), as [`TiledAttention.tokens`][attnviz.tiles.TiledAttention.tokens] (this layer's
        kind only)."""
        if kind not in (None, self.kind):
            raise ValueError(f"this layer holds {self.kind} attention, not {kind}")
        return self.labels[0], self.labels[1]

    def writes(self) -> tuple[str, ...] | None:
        """Per decoder position, the token it writes, as
        [`TiledAttention.writes`][attnviz.tiles.TiledAttention.writes]."""
        return self.labels[2]

    def statistics(self) -> list[dict]:
        """One row per head: layer, head (from 1) and `STATISTICS`."""
        return [{"layer": self.layer, "head": h, **statistics_row(s)} for h, s in enumerate(self.scans, 1)]


def statistics_frame(rows: list[dict], kind: str) -> pd.DataFrame:
    """Rows of [`LayerTiles.statistics`][attnviz.tiles.LayerTiles.statistics] as `attnviz.analysis.head_statistics`
    returns them."""
    frame = pd.DataFrame(rows, columns=["layer", "head", *STATISTICS])
    frame.attrs["distance_note"] = DISTANCE_NOTES[kind]
    return frame


@dataclass(frozen=True)
class TiledAttention:
    """Every head's queries and keys for one text, per kind: its maps on demand, tile by tile.

    ``queries[kind]`` is (L, H, Q, D) and ``keys[kind]`` (L, H_kv, K, D), float32, as the scores use
    them (rotated, for rotary positions); with grouped-query attention query head h uses key head
    h // (H / H_kv). The tokens and the manifest are an export's ([`attnviz.export.AttentionExport`][]):
    [`tokens`][attnviz.tiles.TiledAttention.tokens] and [`writes`][attnviz.tiles.TiledAttention.writes] name rows and
    columns the same way. Made by [`attnviz.api.tiled_attention`][].
    """

    queries: dict[str, np.ndarray]
    keys: dict[str, np.ndarray]
    src_tokens: tuple[str, ...] | None
    tgt_tokens: tuple[str, ...] | None
    manifest: dict

    @property
    def kinds(self) -> list[str]:
        return [k for k in KINDS if k in self.queries]

    def tokens(self, kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(query tokens, key tokens) of ``kind``'s maps, as an export's."""
        if check_kind(kind) not in self.queries:
            raise ValueError(f"this text has no {kind} attention; it has {', '.join(self.kinds)}")
        return kind_tokens(kind, self.src_tokens, self.tgt_tokens)

    def writes(self, end_token: str = "</s>") -> tuple[str, ...] | None:
        """Per decoder position, the token it writes, as an export's."""
        language_model = "encoder" not in self.queries
        return written(self.tgt_tokens, bool(self.manifest.get("tgt_truncated")), language_model, end_token)

    def shape(self, kind: str) -> tuple[int, int, int, int]:
        """(L, H, Q, K) of ``kind``'s maps."""
        self.tokens(kind)  # the message for a kind this text has not
        L, H, Q, _ = self.queries[kind].shape
        return L, H, Q, self.keys[kind].shape[2]

    def head(self, kind: str, layer: int, head: int) -> HeadQK:
        """Head ``head`` of layer ``layer`` (both from 1)."""
        L, H, _, _ = self.shape(kind)
        whole = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (layer, head))
        if not (whole and 1 <= layer <= L and 1 <= head <= H):
            raise ValueError(f"{kind} has {L} layers of {H} heads, counted from 1; got layer {layer!r}, head {head!r}")
        group = H // self.keys[kind].shape[1]
        q = self.queries[kind][layer - 1, head - 1]
        k = self.keys[kind][layer - 1, (head - 1) // group]
        return HeadQK(q, k, causal=kind == "decoder")

    def map(self, kind: str, layer: int, head: int) -> np.ndarray:
        """One head's whole (Q, K) map, float32: 4 Q K bytes, so for a map that fits."""
        one = self.head(kind, layer, head)
        return tile(one, self._scan(one, kind, layer, head), (0, one.shape[0]), (0, one.shape[1]))

    @staticmethod
    def _scan(one: HeadQK, kind: str, layer: int, head: int, *args) -> Scan:
        """`scan` of head ``head`` of layer ``layer``, whose NonFiniteError names the head."""
        try:
            return scan(one, kind, *args)
        except NonFiniteError as e:
            raise NonFiniteError(f"layer {layer}, head {head}: {e}") from None

    def layer_tiles(self, kind: str, layer: int, thumbnail: int = 96) -> LayerTiles:
        """Layer ``layer`` of ``kind``: every head's queries, keys and scan, and its thumbnail of at most
        ``thumbnail`` pixels per axis (max-pooled, blocks from the top left)."""
        _, H, Q, K = self.shape(kind)
        blocks = (block_size(Q, thumbnail), block_size(K, thumbnail))
        heads = tuple(self.head(kind, layer, h) for h in range(1, H + 1))
        scans, thumbnails = [], []
        queries = self.tokens(kind)[0]
        for h, one in enumerate(heads, 1):
            full = self._scan(one, kind, layer, h, blocks[1], queries)
            thumbnails.append([pooled_from_scan(full, blocks[0], per_row_max) for per_row_max in (False, True)])
            scans.append(dataclasses.replace(full, column_maxima=None))  # Q x K / block floats: not kept
        labels = (*self.tokens(kind), self.writes())
        return LayerTiles(kind, layer, heads, tuple(scans), np.array(thumbnails, dtype=np.float32), blocks, labels)

    def statistics(self, kind: str) -> pd.DataFrame:
        """`attnviz.analysis.head_statistics` of ``kind``, every head, computed tile by tile."""
        L, H, _, _ = self.shape(kind)
        queries = self.tokens(kind)[0]
        rows = [
            {
                "layer": layer,
                "head": h,
                **statistics_row(self._scan(self.head(kind, layer, h), kind, layer, h, None, queries)),
            }
            for layer in range(1, L + 1)
            for h in range(1, H + 1)
        ]
        return statistics_frame(rows, kind)
