"""Figures of attention maps: one head as an exact heatmap, and BertViz-style lines.

Long maps, and the grid of every layer and head, are images: `attnviz.figures.images`.

Shape letters: L layers, H heads, Q queries, K keys. Rows are queries and columns are keys, as in
[`attnviz.export.AttentionExport`][]; layers and heads are numbered from 1, positions from 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import (
    AT_THE_EDGE,
    HEAD_COLORS,
    KEY_ANGLES,
    MASKED_GREY,
    MAX_TICK_LABELS,
    NARROW_KEY_CHARS,
    NARROW_KEY_LABELS,
    NARROW_ROW_CHARS,
    NARROW_TICK_FONT,
    SCORE_COLORSCALE,
    WEIGHT_COLORSCALE,
    above_top_labels,
    as_array,
    check_mask,
    check_tokens,
    kind_titles,
    plotly_labels,
    rows_that_fit,
    ticks,
)
from attnviz.figures.images import CONTRASTS, check_contrast, colour_bar, contrast_values


def attention_heatmap(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    title: str | None = None,
    mask: np.ndarray | None = None,
    scores: bool = False,
    query_start: int = 0,
    key_start: int = 0,
    contrast: str = "linear",
    row_max: np.ndarray | None = None,
    narrow: bool = False,
) -> go.Figure:
    """A heatmap of one head's map (Q, K): rows are queries, columns are keys.

    ``query_start`` and ``key_start`` are the positions of the first row and column, for a region
    of a larger map (the queries of one decoding step, a zoomed region of a long input).

    Weights use a fixed 0..1 colour scale under ``contrast`` (`attnviz.figures.images.CONTRASTS`:
    linear, log, or each row scaled to its maximum, ``row_max`` (Q,) when the region's rows go on
    beyond it); the colour bar says which, and hover gives the exact weight whatever the contrast.
    With ``scores`` the map holds pre-softmax scaled scores
    QK^T / sqrt(d_k) (equation 1), shown on a diverging scale centred at 0; their -inf entries are
    masked positions. ``mask`` (Q, K, True = may attend) marks more masked cells. Masked cells are
    NaN in the data trace and drawn grey by a second trace whose hover says "masked", so a masked
    cell never looks like a learned zero. The data are exact (no downsampling); beyond
    ``MAX_TICK_LABELS`` tokens, or more rows than their labels have height for
    (`attnviz.figures.common.rows_that_fit`), only every n-th tick is labelled.

    With ``narrow`` the figure is laid out for a phone (`attnviz.figures.common.NARROW_KEY_LABELS`
    and its neighbours): short upright key labels, short row labels, the colour bar under the map
    and the title wrapped below plotly's toolbar, so that the map keeps most of the width. The
    data and the hover text are the same.
    """
    kind_title, y_title, x_title = kind_titles(kind)
    values = as_array(weights, "weights", 2)
    Q, K = values.shape
    if (Q, K) != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"weights are {Q}x{K} but there are {len(query_tokens)} query and {len(key_tokens)} key tokens"
        )
    masked = np.zeros((Q, K), dtype=bool)
    mask = check_mask(mask, Q, K)
    if mask is not None:
        masked |= ~mask
    if scores:
        masked |= np.isneginf(values)
    check_contrast(contrast)
    if scores and contrast != "linear":
        raise ValueError("contrast applies to weights; scores are shown on their own diverging scale")
    x, y = plotly_labels(key_tokens, key_start), plotly_labels(query_tokens, query_start)
    name = "score" if scores else "weight"
    extra = {}
    if scores:
        scale = {"colorscale": SCORE_COLORSCALE, "zmid": 0.0, "colorbar": {"title": name}}
    else:
        scale = {"colorscale": WEIGHT_COLORSCALE, "zmin": 0.0, "zmax": 1.0, "colorbar": colour_bar(contrast)}
    if contrast != "linear":  # colours from the scaled values, hover from the weights themselves
        extra = {"customdata": values}
        values = contrast_values(values, contrast, row_max).astype(np.float32)
    shown = np.where(masked, np.float32(np.nan), values)
    hover_value = "%{customdata:.6f}" if extra else "%{z:.6f}"
    bar = scale["colorbar"]
    if narrow:  # the colour bar under the map, its title above it
        bar_title = bar["title"] if isinstance(bar["title"], dict) else {"text": bar["title"]}
        scale["colorbar"] = {**bar, **NARROW_COLOUR_BAR, "title": {**bar_title, "side": "top"}}
    else:
        scale["colorbar"] = {**bar, **AT_THE_EDGE}
    traces = [
        go.Heatmap(
            z=shown,
            x=x,
            y=y,
            **scale,
            **extra,
            hoverongaps=False,
            name=name,
            hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{name} {hover_value}<extra></extra>",
        )
    ]
    if masked.any():
        traces.append(
            go.Heatmap(
                z=np.where(masked, 1.0, np.nan).astype(np.float32),
                x=x,
                y=y,
                colorscale=[[0.0, MASKED_GREY], [1.0, MASKED_GREY]],
                showscale=False,
                hoverongaps=False,
                name="masked",
                hovertemplate="query %{y}<br>key %{x}<br>masked<extra></extra>",
            )
        )
    layout_of = _narrow_layout if narrow else _wide_layout
    return go.Figure(data=traces, layout=layout_of(title or kind_title, x, y, x_title, y_title))


OPACITY_LEVELS = 64  # the lines view's opacities, in steps of 1/64: the lines of one head at one step share a trace
COLOUR_BAR_PX = 80  # a phone's colour bar under the map: its 12 px bar, tick labels and title
NARROW_COLOUR_BAR = {"orientation": "h", "thickness": 12, "x": 0.5, "y": -0.02, "yanchor": "top", "ypad": 0}


def _wide_layout(title: str, x: list[str], y: list[str], x_title: str, y_title: str) -> dict:
    """The layout of a heatmap of position labels ``x`` by ``y`` on a screen (see `attention_heatmap`)."""
    layout = above_top_labels(title, x)
    margins = layout["margin"]["t"] + layout["margin"]["b"]
    # 24 px a row up to 900 px in all; long key labels on top never leave the rows less than that, up to 400 px
    height = max(320, min(900, 24 * len(y) + 250), margins + min(24 * len(y), 400))
    rows_px = height - margins  # the map's own height
    return {
        "plot_bgcolor": MASKED_GREY,
        "height": height,
        **layout,
        "xaxis": {"title": x_title, "side": "top", "autotickangles": KEY_ANGLES, **ticks(x, tokens=True)},
        "yaxis": {
            "title": y_title,
            "autorange": "reversed",
            **ticks(y, tokens=True, most=min(MAX_TICK_LABELS, rows_that_fit(rows_px))),
        },
    }


def _narrow_layout(title: str, x: list[str], y: list[str], x_title: str, y_title: str) -> dict:
    """The layout of a heatmap of position labels ``x`` by ``y`` on a phone (see `attention_heatmap`);
    its colour bar is `NARROW_COLOUR_BAR`."""
    layout = above_top_labels(title, x, angle=90, narrow=True)
    layout["margin"]["b"] = COLOUR_BAR_PX
    height = max(320, min(900, 24 * len(y) + 250)) + COLOUR_BAR_PX
    key_ticks = ticks(x, tokens=True, most=NARROW_KEY_LABELS, chars=NARROW_KEY_CHARS)
    rows = rows_that_fit(height - layout["margin"]["t"] - COLOUR_BAR_PX, NARROW_TICK_FONT["size"])
    row_ticks = ticks(y, tokens=True, most=min(MAX_TICK_LABELS, rows), chars=NARROW_ROW_CHARS)
    return {
        "plot_bgcolor": MASKED_GREY,
        "height": height,
        **layout,
        "xaxis": {"title": x_title, "side": "top", "tickangle": -90, **key_ticks},
        "yaxis": {"title": y_title, "autorange": "reversed", **row_ticks},
    }


def lines_view(
    maps_heads: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    heads: Sequence[int],
    kind: str,
    threshold: float = 0.01,
    max_lines: int = 3000,
    contrast: str = "linear",
    layer: int | None = None,
) -> go.Figure:
    """Attention as lines from query tokens (left) to key tokens (right), as in BertViz's head view.

    ``maps_heads`` (H_selected, Q, K) holds some heads of one layer (``layer``, from 1, named in the title),
    ``heads`` their numbers from 1.
    One line per (query, key, head) whose weight is at least ``threshold``, with
    opacity = the weight under ``contrast`` (linear: the weight; log; or the weight over its row's
    largest), to the nearest 1/`OPACITY_LEVELS` and at least that, and one colour per head; hover gives
    the exact weight. The lines of one head at one opacity are one trace (``meta``: the head and the
    (query, key) of each line, in the order of its points), so a figure has at most
    `OPACITY_LEVELS` traces a head, not one a line: thousands of traces took the browser a second to
    draw. Strong lines are drawn last, on top. Each head has a legend entry (clicking it hides or
    shows that head's lines). Beyond ``max_lines`` lines only the strongest ``max_lines`` are drawn
    and the subtitle says how many were left out.
    """
    kind_title, y_title, x_title = kind_titles(kind)
    maps_heads = as_array(maps_heads, "maps_heads", 3)
    n_heads, Q, K = maps_heads.shape
    heads = [int(h) for h in heads]
    if len(heads) != n_heads:
        raise ValueError(f"maps_heads holds {n_heads} heads but {len(heads)} head numbers were given")
    if len(set(heads)) != len(heads) or min(heads, default=1) < 1:
        raise ValueError(f"head numbers start at 1 and must be distinct; got {heads}")
    check_tokens(Q, query_tokens, "query")
    check_tokens(K, key_tokens, "key")
    if max_lines < 1:
        raise ValueError(f"max_lines must be at least 1, got {max_lines}")
    q_labels, k_labels = plotly_labels(query_tokens), plotly_labels(key_tokens)
    colors = {head: HEAD_COLORS[(head - 1) % len(HEAD_COLORS)] for head in heads}
    # Legend entries only: a head with no line above the threshold still shows its colour.
    traces = [
        go.Scatter(
            x=[None],
            y=[None],
            mode="lines",
            line={"color": colors[h], "width": 3},
            name=f"head {h}",
            legendgroup=f"head {h}",
        )
        for h in heads
    ]
    opacity = contrast_values(maps_heads, contrast)  # (H_selected, Q, K) in 0..1
    at_head, at_query, at_key = np.nonzero(maps_heads >= threshold)
    strength = maps_heads[at_head, at_query, at_key]
    order = np.argsort(strength, kind="stable")[-max_lines:]  # the strongest max_lines, weakest first
    at_head, at_query, at_key = at_head[order], at_query[order], at_key[order]
    # A trace's opacity applies to all of it, so the lines of one head at one opacity level share a trace:
    # a few hundred traces at most where one trace a line made thousands, each drawn on its own.
    level = np.clip(np.rint(opacity[at_head, at_query, at_key] * OPACITY_LEVELS), 1, OPACITY_LEVELS).astype(int)
    group = level * n_heads + at_head  # the (opacity step, head) of each line
    by_group = np.argsort(group, kind="stable")  # faintest first: strong lines end on top
    groups, starts = np.unique(group[by_group], return_index=True)
    bounds = [*starts.tolist(), len(by_group)]  # group j's lines: by_group[bounds[j]:bounds[j + 1]]
    for j, g in enumerate(groups.tolist()):
        lv, i = divmod(g, n_heads)
        head, here = heads[i], by_group[bounds[j] : bounds[j + 1]]
        x, y, hover, ends = [], [], [], []
        for q, k in zip(at_query[here].tolist(), at_key[here].tolist(), strict=True):
            text = f"head {head}<br>query {q_labels[q]}<br>key {k_labels[k]}<br>weight {maps_heads[i, q, k]:.6f}"
            x += [0.0, 0.5, 1.0, None]  # the midpoint gives the line a hover point of its own
            y += [q, (q + k) / 2, k, None]
            hover += [text, text, text, ""]
            ends.append((q, k))
        traces.append(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                line={"color": colors[head], "width": 2},
                opacity=lv / OPACITY_LEVELS,
                connectgaps=False,
                legendgroup=f"head {head}",
                showlegend=False,
                hoverinfo="text",
                hovertext=hover,
                meta={"head": head, "lines": ends},
            )
        )
    note = f"lines with weight at least {threshold:g}; opacity = weight" + (
        "" if contrast == "linear" else f" ({CONTRASTS[contrast]})"
    )
    if len(order) < len(strength):
        note += f"; only the {len(order)} strongest of {len(strength)} lines are drawn"
    for x, labels, side in ((0.0, q_labels, "left"), (1.0, k_labels, "right")):
        traces.append(
            go.Scatter(
                x=[x] * len(labels),
                y=list(range(len(labels))),
                mode="text",
                text=labels,
                textposition=f"middle {side}",
                hoverinfo="skip",
                showlegend=False,
            )
        )
    head_list = ", ".join(str(h) for h in heads)
    layout = {
        "title": {
            "text": f"{kind_title}, {'' if layer is None else f'layer {layer}, '}heads {head_list}",
            "subtitle": {"text": note},
        },
        "height": 160 + 22 * max(Q, K, 1),
        "margin": {"l": 10, "r": 10, "t": 130, "b": 10},
        "plot_bgcolor": "white",
        "hovermode": "closest",
        "legend": {"title": {"text": "head"}},
        "annotations": [
            {
                "x": x,
                "y": 1.0,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "showarrow": False,
                "text": f"<b>{text}</b><br>{detail}",
            }
            for x, text, detail in ((0.0, "queries", y_title), (1.0, "keys", x_title))
        ],
        "xaxis": {"visible": False, "range": [-0.9, 1.9], "fixedrange": True},
        "yaxis": {"visible": False, "range": [max(Q, K, 1) - 0.5, -0.5], "fixedrange": True},
    }
    fig = go.Figure(data=traces, layout=layout)
    return fig
