"""The weight views pages share: the words and contrast controls, one head (exact or an image), its zoom.

A map of at most `EXACT_MAX` positions on both axes is an exact heatmap (every weight on
hover); a longer one is an image at full resolution (`attnviz.figures.images`), with a zoom
below it that shows any region of up to `ZOOM_MAX` x `ZOOM_MAX` cells as an exact
heatmap. Every figure goes through `attnviz.app.cache.shared`, keyed on what it shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from attnviz import tiles
from attnviz.analysis import CLEAREST_RULE
from attnviz.app import viewport
from attnviz.app.cache import shared
from attnviz.app.links import bound, range_from_link
from attnviz.app.present import room
from attnviz.app.widgets import clamp_state
from attnviz.export import row_labels  # noqa: F401 - the pages' name for it (defined with the export: one labelling)
from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import export_config
from attnviz.figures.images import (  # the long map's sizes: shared with the notebook views
    CONTRASTS,
    DETAIL,
    OVERVIEW,
    ZOOM_MAX,
    attention_image,
    pooled_attention_image,
    scores_image,
)
from attnviz.kinds import TITLES, causal_mask
from attnviz.tiles import HeadQK, Scan

KIND_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}

EXACT_MAX = 128  # up to this many positions on both axes a map is an exact heatmap; beyond, an image
ZOOM_START = 48  # the zoom's first region: this many positions from the start


def _step_head(keys: tuple[str, str], n_layers: int, n_heads: int, delta: int, whole_layer: bool) -> None:
    """Button callback: the next (+1) or previous (-1) head, across layers; or layer with ``whole_layer``."""
    layer_key, head_key = keys
    layer, head = st.session_state.get(layer_key, 1), st.session_state.get(head_key, 1)
    if whole_layer:
        layer = min(max(layer + delta, 1), n_layers)
    else:
        flat = min(max((layer - 1) * n_heads + head - 1 + delta, 0), n_layers * n_heads - 1)
        layer, head = flat // n_heads + 1, flat % n_heads + 1
    st.session_state[layer_key], st.session_state[head_key] = layer, head


def layer_and_head(
    columns,
    kind: str,
    n_layers: int,
    n_heads: int,
    clearest: tuple[str, int, int],
    keys: tuple[str, str] = ("layer", "head"),
    keyboard: bool = True,
) -> tuple[int, int]:
    """The layer and head pickers (in two containers), opening on the model's ``clearest`` head
    (kind, layer, head: `attnviz.app.cache.clearest_head`), the maps shown being ``kind``'s.

    With ``keyboard``, four small buttons below step through the heads: Shift+Left and Shift+Right
    the previous and next head (on into the next layer), Shift+Up and Shift+Down the layer. When the
    head shown is the clearest one, a caption says by which rule it was chosen.
    """
    layer_key, head_key = keys
    clamp_state(layer_key, range(1, n_layers + 1))
    clamp_state(head_key, range(1, n_heads + 1))
    default_layer, default_head = min(clearest[1], n_layers), min(clearest[2], n_heads)
    first_kind, first_layer, first_head = clearest
    named = getattr(clearest, "named", None)  # a head the model's card names (attnviz.api.HeadChoice)
    which = f"the {named} head that this model's card names" if named else f"the clearest {KIND_NAMES[first_kind]} head"
    rule = f"Opens on layer {first_layer}, head {first_head}, {which}" + ("." if named else f": {CLEAREST_RULE}.")
    layer = bound(
        columns[0].selectbox, "Layer", range(1, n_layers + 1), index=default_layer - 1, key=layer_key, help=rule
    )
    head = bound(columns[1].selectbox, "Head", range(1, n_heads + 1), index=default_head - 1, key=head_key)
    if keyboard:
        steps = (("Previous head", "Shift+Left", -1, False), ("Next head", "Shift+Right", +1, False))
        steps += (("Layer up", "Shift+Up", -1, True), ("Layer down", "Shift+Down", +1, True))
        # each button as wide as its label and its key: in four equal columns, 1024 px wide beside the sidebar
        # cut every label short
        buttons = st.container(horizontal=True)
        for label, shortcut, delta, whole in steps:
            buttons.button(
                label,
                key=f"_{head_key}_{label.lower().replace(' ', '_')}",
                on_click=_step_head,
                args=(keys, n_layers, n_heads, delta, whole),
                shortcut=shortcut,
                help=shortcut,
            )
    if (kind, layer, head) == clearest:
        said = which if named else f"this model's clearest {KIND_NAMES[kind]} head (the ? by Layer says why)"
        st.caption(f"Layer {layer}, head {head}: {said}.")
    return layer, head


def words_toggle(column) -> bool:
    """The words toggle, bound to the URL as ``words``: the same key on every page that offers it."""
    return bound(
        column.toggle,
        "Words",
        key="words",
        help="Merge sub-word pieces into words, as Clark et al. (2019): attention to a word is the sum over its "
        "pieces, attention from a word the mean over its pieces, so rows still sum to 1. Special tokens stay alone.",
    )


def contrast_choice(column) -> str:
    """The contrast of weight maps, bound to the URL as ``contrast``: the same key on every page."""
    return bound(
        column.radio,
        "Contrast",
        list(CONTRASTS),
        format_func=CONTRASTS.get,
        horizontal=True,
        key="contrast",
        help="Linear: the weight on 0..1. Logarithmic: 1e-5 to 1, a decade per fifth of the scale, so small weights "
        "show. Each row to its maximum: where each query looks most, whatever its spread. The colour bar says which.",
    )


def kind_choice(kinds: Sequence[str], key: str, prefer: str | None = "cross") -> str:
    """The kind-of-attention picker (a radio bound to the link as ``key``) over the ``kinds`` there are.

    It opens on ``prefer`` when there is one (cross-attention: where the decoder looks), else on the
    first; a value from a link or an earlier page that is not among ``kinds`` falls back to it.
    """
    kinds = list(kinds)
    clamp_state(key, kinds)
    default = kinds.index(prefer) if prefer in kinds else 0
    captions = [TITLES[k] for k in kinds]
    return bound(st.radio, "Attention", kinds, index=default, captions=captions, horizontal=True, key=key)


def words_and_contrast(words_column, contrast_column) -> tuple[bool, str]:
    """The words toggle and the contrast choice, in two containers; the same keys on every page."""
    return words_toggle(words_column), contrast_choice(contrast_column)


def one_head(
    key: tuple,
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    contrast: str,
    mask: np.ndarray | None,
    title: str,
) -> go.Figure:
    """One (Q, K) weight map as an exact heatmap (laid out for a phone on a narrow screen) or, beyond
    `EXACT_MAX` positions, an image; shared."""
    if max(weights.shape) <= EXACT_MAX:
        narrow = viewport.narrow()
        return shared(
            "one-head-exact",
            (*key, contrast, title, narrow),  # the title too: two sides of a comparison can hold the same map
            lambda: attention_heatmap(
                weights, query_tokens, key_tokens, kind, title, mask, contrast=contrast, narrow=narrow
            ),
        )
    return shared(
        "one-head-image",
        (*key, contrast, title),
        lambda: attention_image(weights, query_tokens, key_tokens, kind, contrast, mask, title),
    )


def one_head_scores(
    key: tuple, scores: np.ndarray, query_tokens: Sequence[str], key_tokens: Sequence[str], kind: str, title: str
) -> go.Figure:
    """One (Q, K) map of scaled scores (-inf where masked), exact (laid out for a phone on a narrow
    screen) or, when long, an image; shared."""
    if max(scores.shape) <= EXACT_MAX:
        narrow = viewport.narrow()
        return shared(
            "one-head-scores",
            (*key, title, narrow),
            lambda: attention_heatmap(scores, query_tokens, key_tokens, kind, title, scores=True, narrow=narrow),
        )
    return shared(
        "one-head-scores-image", (*key, title), lambda: scores_image(scores, query_tokens, key_tokens, kind, title)
    )


def keep_span(key: str, default: tuple[int, int], low: int, high: int) -> None:
    """Keep a range slider's (start, end) inside [low, high] when its bounds change (a new sentence)."""
    start, end = st.session_state.get(key, default)
    start = min(max(int(start), low), high)
    st.session_state[key] = (start, min(max(int(end), start), high))


def zoom(
    prefix: str,
    key: tuple,
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    contrast: str,
    mask: np.ndarray | None,
    title: str,
    scores: bool = False,
    *,
    name: str,
    fmt: str = "png",
) -> None:
    """Two range sliders (bound to the URL as ``{prefix}zoom_q`` and ``{prefix}zoom_k``) and the region
    they choose as an exact heatmap: every weight on hover, the contrast's row maxima from whole rows.
    With ``scores`` the map holds scaled scores, shown on their own diverging scale. Its camera button
    saves ``name`` (the whole map's file name) and the region, as ``fmt``."""
    st.caption(
        f"**Zoom** into a region (up to {ZOOM_MAX} x {ZOOM_MAX}): shown exactly below, with query, key and weight "
        "on hover. Dragging a box on the image above zooms it too."
    )
    q0, q1, k0, k1 = zoom_region(prefix, *weights.shape)
    if q1 - q0 >= ZOOM_MAX or k1 - k0 >= ZOOM_MAX:
        st.info(f"The zoom shows at most {ZOOM_MAX} positions per axis: the first {ZOOM_MAX} of the range chosen.")
        q1, k1 = min(q1, q0 + ZOOM_MAX - 1), min(k1, k0 + ZOOM_MAX - 1)
    rows, cols = slice(q0, q1 + 1), slice(k0, k1 + 1)
    narrow = viewport.narrow()
    fig = shared(
        "zoom",
        (*key, "scores" if scores else contrast, q0, q1, k0, k1, title, narrow),
        lambda: exact_region(
            weights[rows, cols],
            (q0, k0),
            query_tokens,
            key_tokens,
            kind,
            title,
            None if mask is None else mask[rows, cols],
            None if scores else contrast,
            None if scores else weights[rows].max(axis=-1),
            narrow,
        ),
    )
    config = export_config(f"{name}-{region_name(q0, q1, k0, k1)}", fmt)
    st.plotly_chart(room(fig), width="stretch", key=f"_{prefix}zoom_chart", config=config)


def region_name(q0: int, q1: int, k0: int, k1: int) -> str:
    """A region's part of a file name: 'q10-209-k5-150' (first and last query, first and last key)."""
    return f"q{q0}-{q1}-k{k0}-{k1}"


def zoom_region(prefix: str, n_queries: int, n_keys: int) -> tuple[int, int, int, int]:
    """The zoom's two range sliders, bound to the URL as ``{prefix}zoom_q`` and ``{prefix}zoom_k``:
    (first query, last query, first key, last key), inclusive."""
    left, right = st.columns(2)
    q_key, k_key = f"{prefix}zoom_q", f"{prefix}zoom_k"
    range_from_link(q_key), range_from_link(k_key)
    keep_span(q_key, (0, min(n_queries, ZOOM_START) - 1), 0, n_queries - 1)
    keep_span(k_key, (0, min(n_keys, ZOOM_START) - 1), 0, n_keys - 1)
    q0, q1 = bound(left.slider, "Query positions", 0, n_queries - 1, key=q_key)
    k0, k1 = bound(right.slider, "Key positions", 0, n_keys - 1, key=k_key)
    return q0, q1, k0, k1


def exact_region(
    weights: np.ndarray,
    start: tuple[int, int],
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    title: str,
    mask: np.ndarray | None,
    contrast: str | None,
    row_max: np.ndarray | None,
    narrow: bool = False,
) -> go.Figure:
    """A region of a map whose first cell is at ``start`` (query, key), as an exact heatmap: its
    weights under ``contrast`` with whole rows' ``row_max``, or (``contrast`` None) scaled scores;
    with ``narrow`` laid out for a phone."""
    (q0, k0), (n_q, n_k) = start, weights.shape
    return attention_heatmap(
        weights,
        query_tokens[q0 : q0 + n_q],
        key_tokens[k0 : k0 + n_k],
        kind,
        f"{title}: queries {q0}-{q0 + n_q - 1}, keys {k0}-{k0 + n_k - 1}",
        mask,
        scores=contrast is None,
        query_start=q0,
        key_start=k0,
        narrow=narrow,
        **({} if contrast is None else {"contrast": contrast, "row_max": row_max}),
    )


# ---------------------------------------------------------------------------------------------
# A long map, tile by tile (attnviz.tiles): an overview, and any region of it


def _zoom_to_box(chart: str, prefix: str, n_queries: int, n_keys: int) -> None:
    """A box dragged on a picture of a long map sets the zoom's region (runs before the rerun).

    The box is in the map's positions (a cell j spans j - 0.5 .. j + 0.5): every cell it touches is in.
    """
    event = st.session_state.get(chart)
    boxes = event.selection.box if event is not None else []
    if not boxes:
        return
    xs, ys = boxes[-1]["x"], boxes[-1]["y"]

    def span(values, n: int) -> tuple[int, int]:
        low = min(max(math.ceil(min(values) - 0.5), 0), n - 1)
        return low, min(max(math.floor(max(values) + 0.5), low), n - 1)

    st.session_state[f"{prefix}zoom_q"], st.session_state[f"{prefix}zoom_k"] = span(ys, n_queries), span(xs, n_keys)


def _box_select(fig: go.Figure) -> go.Figure:
    """``fig`` (new, not yet shared) with dragging a box selecting a region instead of zooming the picture."""
    return fig.update_layout(dragmode="select", selectdirection="any")


def _box_chart(where, fig: go.Figure, chart: str, prefix: str, shape: tuple[int, int], config: dict) -> None:
    """``fig`` drawn in ``where``, ``config`` its camera button's; a box dragged on it becomes the zoom's region
    (a map of ``shape``)."""
    where.plotly_chart(
        room(fig),
        width="stretch",
        key=chart,
        config=config,
        on_select=lambda: _zoom_to_box(chart, prefix, *shape),
        selection_mode="box",
    )


def long_one_head(
    prefix: str,
    key: tuple,
    head: HeadQK,
    scanned: Scan,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    contrast: str,
    title: str,
    where=st,
    *,
    name: str,
    fmt: str = "png",
) -> None:
    """One head of a long text, tile by tile: the whole map max-pooled to at most `OVERVIEW` pixels,
    and the zoom's region below it, exact up to `ZOOM_MAX` positions a side, else pooled to at most
    `DETAIL` pixels. A box dragged on either picture becomes the zoom's region. The overview goes
    into ``where`` (presenter mode's picture area), the rest below. The camera buttons save ``name``
    (the overview) and ``name`` with the region (the zoom), as ``fmt``."""
    Q, K = head.shape
    per_row = contrast == "row"

    def pooled(rows: tuple[int, int], cols: tuple[int, int], pixels: int, name: str) -> go.Figure:
        values, allowed, blocks = tiles.region(head, scanned, rows, cols, pixels, per_row)
        region = (rows, cols)
        return _box_select(
            pooled_attention_image(values, allowed, blocks, region, query_tokens, key_tokens, kind, contrast, name)
        )

    overview = shared("long-overview", (*key, contrast, title), lambda: pooled((0, Q), (0, K), OVERVIEW, title))
    _box_chart(where, overview, f"_{prefix}overview_chart", prefix, (Q, K), export_config(name, fmt))
    st.caption(
        f"**Zoom**: drag a box on the map, or set the ranges. A region of up to {ZOOM_MAX} x {ZOOM_MAX} positions "
        f"is shown exactly, with query, key and weight on hover; a larger one at up to {DETAIL} pixels a side, "
        "where you can drag a box again."
    )
    q0, q1, k0, k1 = zoom_region(prefix, Q, K)
    rows, cols = (q0, q1 + 1), (k0, k1 + 1)
    region = export_config(f"{name}-{region_name(q0, q1, k0, k1)}", fmt)
    if q1 - q0 < ZOOM_MAX and k1 - k0 < ZOOM_MAX:
        narrow = viewport.narrow()
        fig = shared(
            "long-zoom",
            (*key, contrast, rows, cols, title, narrow),
            lambda: exact_region(
                tiles.tile(head, scanned, rows, cols),
                (q0, k0),
                query_tokens,
                key_tokens,
                kind,
                title,
                causal_mask(q1 - q0 + 1, k1 - k0 + 1, q0 - k0) if head.causal else None,  # key <= query
                contrast,
                scanned.row_max[q0 : q1 + 1],
                narrow,
            ),
        )
        st.plotly_chart(room(fig), width="stretch", key=f"_{prefix}zoom_chart", config=region)
        return
    shown = f"{title}: queries {q0}-{q1}, keys {k0}-{k1}"
    detail = shared("long-detail", (*key, contrast, rows, cols, title), lambda: pooled(rows, cols, DETAIL, shown))
    _box_chart(st, detail, f"_{prefix}detail_chart", prefix, (Q, K), region)
