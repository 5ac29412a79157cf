"""What each notebook view shows, as plain numbers: the host (widget, HTML page, saved file) only draws it.

A frame is a dict of JSON values and byte buffers: palette indices (uint8, one per pixel, the colours
of `attnviz.figures.images` under a contrast), the weights behind them (float16 or float32, for the
numbers on hover) and labels. Contrast, pooling, masks and labels are attnviz's own definitions
(`attnviz.figures.images`, `attnviz.tiles`, `attnviz.words`, `attnviz.export.row_labels`); nothing
here colours or pools a map any other way.

Shape letters: L layers, H heads, Q queries, K keys, h x w pixels.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from attnviz import tiles
from attnviz.decoding import Candidate, Decoding
from attnviz.errors import InputError
from attnviz.export import row_labels
from attnviz.figures.common import WEIGHT_COLORSCALE, kind_titles
from attnviz.figures.images import (
    CONTRASTS,
    DETAIL,
    LEVELS,
    MASKED_INDEX,
    OVERVIEW,
    THUMBNAIL,
    ZOOM_MAX,
    check_contrast,
    colour_bar,
    colour_indices,
    contrast_values,
    palette,
    pooled_thumbnail_indices,
    thumbnail_allowed,
    thumbnail_indices,
)
from attnviz.kinds import TITLES, allowed, causal_mask, shown_token
from attnviz.notebook.data import Source, _check_rows, _check_weights, _numpy, shown, token_list

DTYPES = ("float16", "float32")  # how weights travel to the browser: half the bytes, or every digit
BAND_CELLS = 1 << 21  # weights of a whole map coloured and pooled at a time: float64 copies of 16 MiB each
SCANS_KEPT = 8  # heads of a long text whose overviews (one pass over the map each, 8 MB) are kept for the next choice


def palette_bytes() -> bytes:
    """The weight palette (LEVELS colours, the masked grey, white) as RGB bytes, 3 per index."""
    return palette(WEIGHT_COLORSCALE).tobytes()


def check_pick(source: Source, kind: str, layer: int, head: int) -> tuple[int, int, int, int]:
    """(L, H, Q, K) of ``kind``, after checking that ``kind``, ``layer`` and ``head`` (from 1) exist."""
    for name, value in (("layer", layer), ("head", head)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InputError(f"{name} must be a whole number, counted from 1; got {value!r}")
    if kind not in source.kinds:
        raise InputError(f"these maps have no {kind} attention; they have {', '.join(source.kinds)}")
    L, H, Q, K = source.shape(kind)
    if not (1 <= layer <= L and 1 <= head <= H):
        raise InputError(f"{kind} has {L} layers of {H} heads, counted from 1; got layer {layer}, head {head}")
    return L, H, Q, K


def _pool_max(values: np.ndarray, blocks: tuple[int, int]) -> np.ndarray:
    """Max over blocks of ``blocks`` (rows, columns) cells from the top left, as `attnviz.tiles.region` pools."""
    fr, fc = blocks
    R, C = values.shape
    h, w = math.ceil(R / fr), math.ceil(C / fc)
    padded = np.full((h * fr, w * fc), -np.inf)
    padded[:R, :C] = values
    return padded.reshape(h, fr, w, fc).max(axis=(1, 3))


def _region(zoom, Q: int, K: int) -> tuple[int, int, int, int]:
    """(r0, r1, c0, c1), half-open, of a zoom (None or [] is the whole map), clipped to the map."""
    if not zoom:
        return 0, Q, 0, K
    r0, r1, c0, c1 = (int(v) for v in zoom)
    r0, c0 = min(max(r0, 0), Q - 1), min(max(c0, 0), K - 1)
    return r0, min(max(r1, r0 + 1), Q), c0, min(max(c1, c0 + 1), K)


class HeadFrames:
    """The head view's frames of one source: any kind, layer, head, contrast, words and zoom."""

    def __init__(self, source: Source, dtype: str = "float32"):
        if dtype not in DTYPES:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        self.source, self.dtype = source, dtype
        self._scans: OrderedDict = OrderedDict()

    def _scan(self, kind: str, layer: int, head: int) -> Overview:
        key = (kind, layer, head)
        if key not in self._scans:
            self._scans[key] = overview(self.source.pieces.head(kind, layer, head), kind)
            while len(self._scans) > SCANS_KEPT:
                self._scans.popitem(last=False)
        self._scans.move_to_end(key)
        return self._scans[key]

    def labels(self, kind: str, words: bool) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of ``kind``: queries as the app names them, keys as tokens."""
        maps = self.source.words if words else self.source.pieces
        return [shown_token(t) for t in row_labels(maps, kind)], [shown_token(t) for t in maps.tokens(kind)[1]]

    def frame_bytes(self, kind: str, words: bool = False) -> int:
        """The bytes of palette indices and weights in a frame of ``kind``'s whole map (any layer, head or
        contrast), from its shape alone: one pixel per weight up to `OVERVIEW` a side, else max-pooled."""
        Q, K = (getattr(self.source.words, kind).shape if words else self.source.shape(kind))[-2:]
        h, w = math.ceil(Q / tiles.block_size(Q, OVERVIEW)), math.ceil(K / tiles.block_size(K, OVERVIEW))
        return h * w * (1 + np.dtype(self.dtype).itemsize)

    def frame(self, kind: str, layer: int, head: int, contrast: str, words: bool = False, zoom=None) -> dict:
        """What the head view draws for this choice: see the module's docstring."""
        check_contrast(contrast)
        check_pick(self.source, kind, layer, head)
        if words and self.source.words is None:
            raise InputError("these maps come without words (the tokenizer's word boundaries): words=False")
        maps = self.source.words if words else self.source.pieces
        if self.source.tiled:
            Q, K = self.source.shape(kind)[2:]
            r0, r1, c0, c1 = _region(zoom, Q, K)
            frame = self._tiled(kind, layer, head, contrast, (r0, r1, c0, c1))
        else:
            weights = getattr(maps, kind)[layer - 1, head - 1]  # (Q, K)
            Q, K = weights.shape
            r0, r1, c0, c1 = _region(zoom, Q, K)
            frame = self._whole(weights, kind, contrast, (r0, r1, c0, c1))
        rows, cols = self.labels(kind, words)
        title, row_title, col_title = kind_titles(kind)
        pooled = frame["blocks"] != [1, 1]
        note = f"queries {r0}-{r1 - 1}, keys {c0}-{c1 - 1}; contrast: {CONTRASTS[contrast]}"
        if pooled:
            fr, fc = frame["blocks"]
            note = f"each pixel the largest of {fr} x {fc} weights (max-pooled; drag a box to zoom); " + note
        else:
            note = "one pixel per weight; " + note
        return {
            **frame,
            "kind": kind,
            "layer": layer,
            "head": head,
            "contrast": contrast,
            "words": bool(words),
            "title": f"{title}: layer {layer}, head {head}" + (" (words)" if words else ""),
            "row_title": row_title,
            "col_title": col_title,
            "rows": rows,
            "cols": cols,
            "full": [Q, K],
            "region": [r0, r1, c0, c1],
            "bar": colour_bar(contrast),
            "note": note,
            "levels": LEVELS,
            "masked_index": MASKED_INDEX,
        }

    def _pack(self, indices: np.ndarray, weights: np.ndarray, blocks, values: str) -> dict:
        return {
            "shape": list(indices.shape),
            "blocks": [int(blocks[0]), int(blocks[1])],
            "indices": np.ascontiguousarray(indices, dtype=np.uint8).tobytes(),
            "weights": np.ascontiguousarray(weights, dtype=self.dtype).tobytes(),
            "dtype": self.dtype,
            "values": values,  # what a pixel's number is
        }

    def _whole(self, weights: np.ndarray, kind: str, contrast: str, region) -> dict:
        """A region of a whole map: one pixel per weight up to OVERVIEW a side, else max-pooled.

        A pooled region is coloured and pooled a band of rows at a time (`BAND_CELLS`): done whole, a plain
        map of 6,000 tokens (137 MiB) had taken 0.6-0.9 GiB more for its first picture, in float64 copies of
        itself, and one of 16,000 would have taken several GiB.
        """
        r0, r1, c0, c1 = region
        causal = allowed(kind, 1, 1) is not None  # a decoder's map: a query's later keys are masked
        row_max = weights[r0:r1].max(axis=-1)  # of whole rows: a region's rows go on beyond it
        blocks = (tiles.block_size(r1 - r0, OVERVIEW), tiles.block_size(c1 - c0, OVERVIEW))
        if blocks == (1, 1):
            part = weights[r0:r1, c0:c1]
            masked = ~causal_mask(r1 - r0, c1 - c0, r0 - c0) if causal else None  # key <= query
            indices = colour_indices(contrast_values(part, contrast, row_max), masked)
            return self._pack(indices, part, blocks, _pooled_values(blocks, False))
        fr = blocks[0]
        band = fr * max(1, BAND_CELLS // (fr * (c1 - c0)))  # rows: whole blocks of rows, so bands pool as the whole
        coloured, peaks = [], []
        for b0 in range(r0, r1, band):
            b1 = min(b0 + band, r1)
            part = weights[b0:b1, c0:c1]
            coloured.append(_pool_max(contrast_values(part, contrast, row_max[b0 - r0 : b1 - r0]), blocks))
            peaks.append(_pool_max(part, blocks))
        masked = ~tiles.allowed_blocks(True, (r0, r1), (c0, c1), blocks) if causal else None
        indices = colour_indices(np.concatenate(coloured), masked)
        return self._pack(indices, np.concatenate(peaks), blocks, _pooled_values(blocks, False))

    def _tiled(self, kind: str, layer: int, head: int, contrast: str, region) -> dict:
        """A region of a long map from its queries and keys: exact up to ZOOM_MAX a side, else pooled."""
        r0, r1, c0, c1 = region
        seen = self._scan(kind, layer, head)
        one, scanned = seen.head, seen.scan
        if (r0, r1, c0, c1) == (0, one.shape[0], 0, one.shape[1]) and (r1 > ZOOM_MAX or c1 > ZOOM_MAX):
            per_row = contrast == "row"
            values = seen.per_row if per_row else seen.linear
            indices = colour_indices(contrast_values(values, "linear" if per_row else contrast), ~seen.allowed)
            if seen.blocks == (1, 1):  # one pixel per weight: hover tells the weight itself
                return self._pack(indices, seen.linear, seen.blocks, _pooled_values(seen.blocks, False))
            return self._pack(indices, values, seen.blocks, _pooled_values(seen.blocks, per_row))
        if r1 - r0 <= ZOOM_MAX and c1 - c0 <= ZOOM_MAX:
            weights = tiles.tile(one, scanned, (r0, r1), (c0, c1))
            mask = causal_mask(r1 - r0, c1 - c0, r0 - c0) if one.causal else None  # key <= query
            coloured = contrast_values(weights, contrast, scanned.row_max[r0:r1])
            return self._pack(colour_indices(coloured, None if mask is None else ~mask), weights, (1, 1), "weight")
        per_row = contrast == "row"
        values, ok, blocks = tiles.region(one, scanned, (r0, r1), (c0, c1), DETAIL, per_row)  # as the app's zoom
        indices = colour_indices(contrast_values(values, "linear" if per_row else contrast), ~ok)
        return self._pack(indices, values, blocks, _pooled_values(blocks, per_row))


def _pooled_values(blocks: tuple[int, int], per_row: bool) -> str:
    """What a pixel's number is, for a map pooled over ``blocks``."""
    what = "weight ÷ its row's max" if per_row else "weight"
    return what if tuple(blocks) == (1, 1) else f"largest {what}, of the block"


@dataclass(frozen=True)
class Overview:
    """One head of a long text as the head view opens it: its scan (the rows' normalisers, for zooms) and its
    whole map max-pooled to at most `OVERVIEW` pixels a side, as `attnviz.tiles.region` pools it."""

    head: tiles.HeadQK
    scan: tiles.Scan  # without statistics or column maxima
    linear: np.ndarray  # (h, w) float32: the largest weight of each block
    per_row: np.ndarray  # (h, w) float32: the largest weight ÷ its row's largest, of each block
    allowed: np.ndarray  # (h, w) bool: whether any cell of the block may be non-zero
    blocks: tuple[int, int]  # positions per pixel: (rows, columns)


def overview(head: tiles.HeadQK, kind: str) -> Overview:
    """``head``'s `Overview`, in one pass over its map: the scan keeps each row's maxima over blocks of columns
    (`attnviz.tiles.scan`), and the pixels are their maxima over blocks of rows
    (`attnviz.tiles.pooled_from_scan`), under both the weights and the weights ÷ their row's largest.
    No statistics: the view does not show them, and they would double the pass."""
    Q, K = head.shape
    blocks = (tiles.block_size(Q, OVERVIEW), tiles.block_size(K, OVERVIEW))
    scanned = tiles.scan(head, kind, column_block=blocks[1], statistics=False)
    linear, per_row = (tiles.pooled_from_scan(scanned, blocks[0], p) for p in (False, True))
    allowed = tiles.allowed_blocks(head.causal, (0, Q), (0, K), blocks)
    return Overview(head, replace(scanned, column_maxima=None), linear, per_row, allowed, blocks)


def grid_bytes(source: Source, kind: str, thumbnail: int = THUMBNAIL) -> int:
    """The bytes of `grid_frame`'s palette indices for ``kind`` (any contrast), from its shape alone: whole maps
    pool to at most ``thumbnail`` pixels a side (`attnviz.analysis.downsample`), tiles in whole blocks."""
    L, H, Q, K = source.shape(kind)
    if source.tiled:
        h, w = (math.ceil(n / tiles.block_size(n, thumbnail)) for n in (Q, K))
    else:
        h, w = min(Q, thumbnail), min(K, thumbnail)
    return L * H * h * w


def grid_frame(source: Source, kind: str, contrast: str, thumbnail: int = THUMBNAIL) -> dict:
    """The model view's thumbnails of ``kind``: every layer and head max-pooled to ``thumbnail`` pixels a side,
    as `attnviz.figures.images.head_grid` draws them."""
    check_contrast(contrast)
    L, H, Q, K = check_pick(source, kind, 1, 1)
    if source.tiled:
        thumbs = [source.pieces.layer_tiles(kind, layer, thumbnail) for layer in range(1, L + 1)]
        blocks = thumbs[0].blocks
        ok = tiles.allowed_blocks(kind == "decoder", (0, Q), (0, K), blocks)
        indices = np.stack(
            [np.stack([pooled_thumbnail_indices(t.thumbnails[h], ok, contrast) for h in range(H)]) for t in thumbs]
        )
    else:
        maps = getattr(source.pieces, kind)
        mask = allowed(kind, Q, K)
        ok = None if mask is None else thumbnail_allowed(mask, thumbnail)
        indices = np.stack(
            [np.stack([thumbnail_indices(maps[la, h], contrast, ok, thumbnail) for h in range(H)]) for la in range(L)]
        )
        blocks = (math.ceil(Q / min(Q, thumbnail)), math.ceil(K / min(K, thumbnail)))
    _, h, w = indices.shape[1:]
    return {
        "grid_kind": kind,
        "grid_shape": [int(L), int(H), int(h), int(w)],
        "grid_blocks": [int(blocks[0]), int(blocks[1])],
        "grid": np.ascontiguousarray(indices, dtype=np.uint8).tobytes(),
        "grid_title": f"{TITLES[kind]}: {L} layers x {H} heads"
        + (
            f" (max-pooled: each pixel the largest of up to {blocks[0]}x{blocks[1]} weights)"
            if blocks != (1, 1)
            else ""
        ),
    }


def step_data(decoding, src_tokens, tgt_tokens, id_to_token) -> dict:
    """The step view's numbers for a decoding (`attnviz.decoding.Decoding`): per step, the token written,
    its probability, the top candidates, and each layer's and head's rows over the source and the prefix.

    Returns JSON values and two float32 buffers: ``self_rows`` (steps, L, H, P) with P the longest
    prefix (zero-padded past each step's own), ``cross_rows`` (steps, L, H, S) or empty for a
    language model. ``tgt_tokens`` is the decoder input (the start token or the prompt, then the output): P
    tokens, or P + 1 with the last token written. Each token a step wrote is checked against it.
    """
    if not isinstance(decoding, Decoding):
        raise InputError(
            f"step_view takes an attnviz.decoding.Decoding (or a model and a text); got {type(decoding).__name__}"
        )
    steps = decoding.steps
    if not steps:
        raise InputError("this decoding has no steps")
    if not callable(id_to_token):
        raise InputError(f"id_to_token must be a function from an id to its token; got {type(id_to_token).__name__}")
    src_tokens = None if src_tokens is None else token_list(src_tokens, "src_tokens")
    tgt_tokens = token_list(tgt_tokens, "tgt_tokens")
    for i, step in enumerate(steps):
        _check_probabilities(step, f"step {i} (from 0)")
    token_of = _token_names(id_to_token, [i for s in steps for i in (s.token_id, *(c.token_id for c in s.top))])
    own_rows = _step_rows(steps, "self_attn", 2)
    L, H = own_rows[0].shape[:2]
    lengths = [int(r.shape[-1]) for r in own_rows]
    for i, n in enumerate(lengths):  # each step reads what the last read and the token it wrote
        if n != lengths[0] + i:
            raise InputError(
                f"step {i} (from 0)'s self_attn rows read {n} decoder input tokens, step 0's {lengths[0]}: each step "
                f"reads one more than the step before ({lengths[0] + i} here), the token the step before wrote"
            )
    P = max(lengths)
    self_rows = np.zeros((len(steps), L, H, P), dtype=np.float32)
    for i, rows in enumerate(own_rows):
        self_rows[i, :, :, : lengths[i]] = rows
    crossed = [s.cross_attn is not None for s in steps]
    if any(crossed) and not all(crossed):
        raise InputError(
            f"this decoding has cross-attention in some steps and not in others (step {crossed.index(not crossed[0])} "
            "from 0 differs from step 0): every step of an encoder-decoder has it, no step of a language model"
        )
    has_cross = crossed[0]
    if has_cross:  # each step's cross row has one weight per source token: the view reads them by that count
        cross_rows = np.stack(_step_rows(steps, "cross_attn", 3))
        if cross_rows.shape[1:3] != (L, H):
            raise InputError(
                f"this decoding's cross_attn rows are {cross_rows.shape[1:]} (layers, heads, source) but its "
                f"self_attn rows have {L} layers of {H} heads: each step's rows come from the same heads"
            )
        S = int(cross_rows.shape[-1])
        if src_tokens is None or len(src_tokens) != S:
            given = "none" if src_tokens is None else len(src_tokens)
            raise InputError(f"this decoding's cross-attention reads {S} source tokens; src_tokens gives {given}")
    else:
        if src_tokens:
            raise InputError("this decoding has no cross-attention (a language model's): give no src_tokens")
        cross_rows = np.zeros((0,), dtype=np.float32)
    prefix = list(tgt_tokens)
    if len(prefix) not in (P, P + 1):
        raise InputError(
            f"the last step reads {P} decoder input tokens but tgt_tokens gives {len(prefix)}: give the decoder "
            f"input (the start token or the prompt, then each token written but the last), {P} tokens, or {P + 1} "
            "with the last token written"
        )
    for i, (step, n) in enumerate(zip(steps, lengths, strict=True)):  # step i writes position n of the input
        if n < len(prefix) and prefix[n] != token_of[step.token_id]:
            raise InputError(
                f"tgt_tokens[{n}] is {prefix[n]!r}, but step {i} (from 0) wrote {token_of[step.token_id]!r} "
                f"(id {step.token_id}) there: tgt_tokens must be the decoder input, from its first token, as "
                "id_to_token names the tokens (a list shifted by one holds what each step writes instead)"
            )
    return {
        "n_steps": len(steps),
        "n_layers": int(L),
        "n_heads": int(H),
        "prefix_len": int(P),
        "step_lengths": lengths,
        "src": [shown_token(t) for t in (src_tokens or [])],
        "prefix": [shown_token(t) for t in prefix[:P]],
        "written": [shown_token(token_of[s.token_id]) for s in steps],
        "prob": [float(s.prob) for s in steps],
        "top": [[[shown_token(token_of[c.token_id]), float(c.prob)] for c in s.top] for s in steps],
        "self_rows": self_rows.tobytes(),
        "cross_rows": cross_rows.tobytes(),
        "truncated": bool(decoding.truncated),
    }


def _token_names(id_to_token, ids) -> dict:
    """{id: its token} for ``ids``, from the user's ``id_to_token``; an InputError naming the id when it fails or
    gives anything but a string (None or the id itself had been drawn as a label, and failed the still picture)."""
    names = {}
    for token_id in ids:
        if token_id in names:
            continue
        try:
            token = id_to_token(token_id)
        except Exception as e:  # the user's function: its own failure, named with the id it was given
            raise InputError(
                f"id_to_token({shown(token_id)}) raised {type(e).__name__}: {e}; it must name every id the decoding "
                "wrote or proposed"
            ) from e
        if not isinstance(token, str):
            raise InputError(
                f"id_to_token({shown(token_id)}) gave {shown(token)} ({type(token).__name__}): it must give each id's "
                "token as a string (e.g. tokenizer.convert_ids_to_tokens)"
            )
        names[token_id] = token
    return names


def _step_rows(steps, name: str, same: int) -> list[np.ndarray]:
    """Each step's ``name`` rows (L, H, n) as float32, checked as plain maps are (`attnviz.notebook.data`): finite
    weights in 0..1, each row summing to 1, and the first ``same`` axes of every step's as step 0's."""
    rows = []
    for i, step in enumerate(steps):
        what = f"step {i} (from 0)'s {name}"
        one = _numpy(getattr(step, name), what)
        if one.ndim != 3:
            raise InputError(f"{what} must be one row per layer and head, (layers, heads, positions); got {one.shape}")
        if rows and one.shape[:same] != rows[0].shape[:same]:
            raise InputError(f"{what} is {one.shape}, step 0's {rows[0].shape}: every step has the same heads")
        _check_weights(one[:, :, None], what)  # (L, H, 1, n): one query's row of each head
        _check_rows(one[:, :, None], what, causal=name == "self_attn")
        rows.append(one)
    return rows


def _check_probabilities(step, what: str) -> None:
    """Nothing, or an InputError when ``step``'s probability or candidates are not probabilities (0..1, finite)."""
    if not all(isinstance(c, Candidate) for c in step.top):
        raise InputError(f"{what}'s top candidates must be attnviz.decoding.Candidate(token_id, prob)")
    for name, prob in (("probability", step.prob), *(("candidates' probability", c.prob) for c in step.top)):
        try:
            value = float(prob)
        except (TypeError, ValueError):
            value = math.nan
        if not 0 <= value <= 1:  # NaN too
            raise InputError(f"{what}'s {name} is {prob!r}: a probability lies in 0..1")


def atlas_data(atlas) -> dict:
    """The atlas view's numbers: per kind, each head's place on the map (MDS) and its statistics."""
    from plotly.colors import sample_colorscale

    from attnviz.figures.atlas import MAP_COLORSCALE, STATISTIC_LABELS

    points = atlas.heads.merge(atlas.mds, on=["kind", "layer", "head"])
    statistics = [s for s in STATISTIC_LABELS if s in points.columns]
    kinds = {}
    for kind in atlas.kinds:
        rows = points[points["kind"] == kind].sort_values(["layer", "head"])
        colours = {}
        for stat in statistics:
            values = rows[stat].to_numpy(dtype=np.float64)
            known = np.isfinite(values)
            lo, hi = (values[known].min(), values[known].max()) if known.any() else (0.0, 1.0)
            scaled = np.where(known, (values - lo) / (hi - lo if hi > lo else 1.0), 0.0)
            sampled = sample_colorscale(MAP_COLORSCALE, list(scaled), colortype="rgb")
            colours[stat] = {
                "values": [float(v) if np.isfinite(v) else None for v in values],
                "colours": [c if k else "#bdbdbd" for c, k in zip(sampled, known, strict=True)],
                "range": [float(lo), float(hi)],
            }
        kinds[kind] = {
            "layer": rows["layer"].astype(int).tolist(),
            "head": rows["head"].astype(int).tolist(),
            "x": rows["x"].astype(float).tolist(),
            "y": rows["y"].astype(float).tolist(),
            "statistics": colours,
        }
    return {
        "kinds": list(kinds),
        "statistics": statistics,
        "labels": {s: STATISTIC_LABELS[s] for s in statistics},
        "atlas": kinds,
        "sentences": int(atlas.inputs.shape[0]),
        "titles": {k: TITLES[k] for k in kinds},
    }
