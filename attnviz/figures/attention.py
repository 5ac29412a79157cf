"""Figures of attention maps: one head large, every layer and head as a grid, and BertViz-style lines.

Shape letters: L layers, H heads, Q queries, K keys. Rows are queries and columns are keys, as in
:class:`attnviz.export.AttentionExport`; layers and heads are numbered from 1, positions from 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.analysis import downsample
from attnviz.figures.common import (
    HEAD_COLORS,
    HIGHLIGHT,
    MASKED_GREY,
    SCORE_COLORSCALE,
    WEIGHT_COLORSCALE,
    above_top_labels,
    as_array,
    check_tokens,
    kind_titles,
    plotly_labels,
    ticks,
)


def attention_heatmap(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    title: str | None = None,
    mask: np.ndarray | None = None,
    scores: bool = False,
    query_start: int = 0,
) -> go.Figure:
    """A heatmap of one head's map (Q, K): rows are queries, columns are keys.

    ``query_start`` is the position of the first row, for a slice of the queries (one decoding step).

    Weights use a fixed 0..1 colour scale. With ``scores`` the map holds pre-softmax scaled scores
    QK^T / sqrt(d_k) (equation 1), shown on a diverging scale centred at 0; their -inf entries are
    masked positions. ``mask`` (Q, K, True = may attend) marks more masked cells. Masked cells are
    NaN in the data trace and drawn grey by a second trace whose hover says "masked", so a masked
    cell never looks like a learned zero. The data are exact (no downsampling); beyond
    ``MAX_TICK_LABELS`` tokens only every n-th tick is labelled.
    """
    kind_title, y_title, x_title = kind_titles(kind)
    values = as_array(weights, "weights", 2)
    Q, K = values.shape
    if (Q, K) != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"weights are {Q}x{K} but there are {len(query_tokens)} query and {len(key_tokens)} key tokens"
        )
    masked = np.zeros((Q, K), dtype=bool)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (Q, K):
            raise ValueError(f"mask is {mask.shape} but the weights are {(Q, K)}; pass one flag per cell")
        masked |= ~mask
    if scores:
        masked |= np.isneginf(values)
    shown = np.where(masked, np.float32(np.nan), values)
    x, y = plotly_labels(key_tokens), plotly_labels(query_tokens, query_start)
    name = "score" if scores else "weight"
    scale = (
        {"colorscale": SCORE_COLORSCALE, "zmid": 0.0}
        if scores
        else {"colorscale": WEIGHT_COLORSCALE, "zmin": 0.0, "zmax": 1.0}
    )
    fig = go.Figure(
        go.Heatmap(
            z=shown,
            x=x,
            y=y,
            **scale,
            colorbar={"title": name},
            hoverongaps=False,
            name=name,
            hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{name} %{{z:.6f}}<extra></extra>",
        )
    )
    if masked.any():
        fig.add_trace(
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
    fig.update_layout(
        plot_bgcolor=MASKED_GREY,
        height=max(320, min(900, 24 * Q + 250)),
        **above_top_labels(title or kind_title, x),
    )
    fig.update_xaxes(title=x_title, side="top", tickangle=-60, **ticks(x))
    fig.update_yaxes(title=y_title, autorange="reversed", **ticks(y))
    return fig


def _block_labels(tokens: Sequence[str], ranges: list[tuple[int, int]]) -> list[str]:
    """Hover labels for the cells of a downsampled axis: the position label, or the span of positions."""
    labels = plotly_labels(tokens)
    return [labels[a] if b - a == 1 else f"positions {a}-{b - 1}" for a, b in ranges]


def model_view(
    maps: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    max_cells: int = 48,
    selected: tuple[int, int] | None = None,
) -> go.Figure:
    """A layers x heads grid of small heatmaps of ``maps`` (L, H, Q, K) on one shared 0..1 scale.

    Thumbnails for choosing a head: no tick labels, values rounded to 4 decimals. An axis longer
    than ``max_cells`` is block-averaged with :func:`attnviz.analysis.downsample`, and the title says
    so. ``selected`` (layer, head), from 1, outlines that subplot.
    """
    kind_title, y_title, x_title = kind_titles(kind)
    maps = as_array(maps, "maps", 4)
    L, H, Q, K = maps.shape
    check_tokens(Q, query_tokens, "query")
    check_tokens(K, key_tokens, "key")
    if selected is not None and not (1 <= selected[0] <= L and 1 <= selected[1] <= H):
        raise ValueError(f"selected is (layer, head) from 1; these maps have {L} layers and {H} heads, got {selected}")
    if max_cells < 1:
        raise ValueError(f"max_cells must be at least 1, got {max_cells}")
    fig = make_subplots(
        rows=L,
        cols=H,
        row_titles=[f"layer {layer}" for layer in range(1, L + 1)],
        column_titles=[f"head {head}" for head in range(1, H + 1)],
        horizontal_spacing=0.01,
        vertical_spacing=min(0.02, 1 / max(L - 1, 1)),
    )
    downsampled = Q > max_cells or K > max_cells
    row_ranges = [(q, q + 1) for q in range(Q)]
    col_ranges = [(k, k + 1) for k in range(K)]
    for layer in range(1, L + 1):
        for head in range(1, H + 1):
            cells = maps[layer - 1, head - 1]
            if downsampled:
                cells, row_ranges, col_ranges = downsample(cells, max_cells)
            fig.add_trace(
                go.Heatmap(
                    z=np.round(cells, 4).astype(np.float32),
                    x=_block_labels(key_tokens, col_ranges),
                    y=_block_labels(query_tokens, row_ranges),
                    coloraxis="coloraxis",
                    name=f"layer {layer} head {head}",
                    hovertemplate=(
                        f"layer {layer} head {head}<br>query %{{y}}<br>key %{{x}}<br>weight %{{z:.4f}}<extra></extra>"
                    ),
                ),
                row=layer,
                col=head,
            )
    title = f"{kind_title}: {L} layers x {H} heads"
    if downsampled:
        rows = max(b - a for a, b in row_ranges)
        cols = max(b - a for a, b in col_ranges)
        title += f" (downsampled: each cell averages up to {rows}x{cols} positions)"
    if selected is not None:
        fig.add_shape(
            type="rect",
            xref="x domain",
            yref="y domain",
            x0=0,
            x1=1,
            y0=0,
            y1=1,
            line={"color": HIGHLIGHT, "width": 3},
            row=selected[0],
            col=selected[1],
        )
    fig.update_xaxes(showticklabels=False, ticks="", type="category")
    fig.update_yaxes(showticklabels=False, ticks="", type="category", autorange="reversed")
    fig.update_layout(
        title={"text": title, "subtitle": {"text": f"in each map, rows: {y_title}; columns: {x_title}"}},
        coloraxis={"cmin": 0.0, "cmax": 1.0, "colorscale": WEIGHT_COLORSCALE, "colorbar": {"title": "weight"}},
        height=110 + 90 * L,
        margin={"l": 10, "r": 40, "t": 100, "b": 10},
    )
    return fig


def lines_view(
    maps_heads: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    heads: Sequence[int],
    kind: str,
    threshold: float = 0.01,
    max_lines: int = 3000,
) -> go.Figure:
    """Attention as lines from query tokens (left) to key tokens (right), as in BertViz's head view.

    ``maps_heads`` (H_selected, Q, K) holds some heads of one layer, ``heads`` their numbers from 1.
    One line (one trace) per (query, key, head) whose weight is at least ``threshold``, with
    opacity = weight and one colour per head; hover gives the exact weight. Strong lines are drawn
    last, on top. Each head has a legend entry (clicking it hides or shows that head's lines).
    Beyond ``max_lines`` lines the browser slows down, so only the strongest ``max_lines`` are drawn
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
    at_head, at_query, at_key = np.nonzero(maps_heads >= threshold)
    strength = maps_heads[at_head, at_query, at_key]
    order = np.argsort(strength, kind="stable")[-max_lines:]  # weakest first: strong lines end on top
    for i, q, k in zip(at_head[order].tolist(), at_query[order].tolist(), at_key[order].tolist(), strict=True):
        head, w = heads[i], float(maps_heads[i, q, k])
        traces.append(
            go.Scatter(
                x=[0.0, 0.5, 1.0],  # the midpoint gives the line a hover point of its own
                y=[q, (q + k) / 2, k],
                mode="lines",
                line={"color": colors[head], "width": 2},
                opacity=min(w, 1.0),
                legendgroup=f"head {head}",
                showlegend=False,
                hoverinfo="text",
                hovertext=f"head {head}<br>query {q_labels[q]}<br>key {k_labels[k]}<br>weight {w:.6f}",
                meta={"head": head, "query": q, "key": k},
            )
        )
    note = f"lines with weight at least {threshold:g}; opacity = weight"
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
    fig = go.Figure(traces)
    for x, text, detail in ((0.0, "queries", y_title), (1.0, "keys", x_title)):
        fig.add_annotation(
            x=x,
            y=1.0,
            xref="x",
            yref="paper",
            yanchor="bottom",
            showarrow=False,
            text=f"<b>{text}</b><br>{detail}",
        )
    head_list = ", ".join(str(h) for h in heads)
    fig.update_layout(
        title={
            "text": f"{kind_title}, heads {head_list}",
            "subtitle": {"text": note},
        },
        height=160 + 22 * max(Q, K, 1),
        margin={"l": 10, "r": 10, "t": 130, "b": 10},
        plot_bgcolor="white",
        hovermode="closest",
        legend={"title": {"text": "head"}},
    )
    fig.update_xaxes(visible=False, range=[-0.9, 1.9], fixedrange=True)
    fig.update_yaxes(visible=False, range=[max(Q, K, 1) - 0.5, -0.5], fixedrange=True)
    return fig
