"""Figures of the head atlas: the heads of one kind as points on a 2-D map, coloured by a statistic.

The map's coordinates come from classical MDS of the Jensen-Shannon distances between heads
(``mds.parquet``): heads close together attend alike over the corpus. The axes have no units of
their own; only distances on the map mean something. A head's own map for one sentence is drawn
with :func:`attnviz.figures.attention.attention_heatmap`.
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import HIGHLIGHT, MASKED_GREY
from attnviz.kinds import TITLES, check_kind

# What each statistic measures, with its unit: colour bar titles, captions and the README agree.
STATISTIC_LABELS = {
    "entropy": "entropy (nats)",
    "mean_distance": "mean distance (tokens)",
    "diagonal": "weight on the aligned key",
    "previous": "weight on the previous key",
    "next": "weight on the next key",
    "first": "weight on the first key",
    "last": "weight on the last key",
    "special": "weight on special tokens",
    "punctuation": "weight on punctuation",
    "confidence": "largest weight (confidence)",
    "argmax_previous": "share of rows whose largest weight is on the previous key",
    "argmax_next": "share of rows whose largest weight is on the next key",
}
MAP_COLORSCALE = "Viridis"


def head_map(
    layers,
    heads,
    x,
    y,
    values,
    statistic: str,
    kind: str,
    selected: tuple[int, int] | None = None,
    positional=None,
) -> go.Figure:
    """Each head of ``kind`` at (x, y), coloured by its mean ``statistic`` over the corpus.

    ``layers``, ``heads`` (from 1), ``x``, ``y``, ``values`` are equal-length sequences, one entry
    per head; a NaN value (a statistic the kind does not have) is drawn grey. ``selected`` (layer,
    head) is ringed; ``positional`` (booleans, optional) marks Voita et al.'s positional heads with
    a diamond. Each point carries [layer, head] as customdata, for click selection.
    """
    check_kind(kind)
    layers, heads = np.asarray(layers, dtype=int), np.asarray(heads, dtype=int)
    x, y, values = (np.asarray(a, dtype=np.float64) for a in (x, y, values))
    n = len(layers)
    if not all(len(a) == n for a in (heads, x, y, values)):
        raise ValueError("layers, heads, x, y and values must have one entry per head each")
    if statistic not in STATISTIC_LABELS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTIC_LABELS)}; got {statistic!r}")
    label = STATISTIC_LABELS[statistic]
    flags = np.zeros(n, dtype=bool) if positional is None else np.asarray(positional, dtype=bool)
    names = [f"L{layer}H{head}" for layer, head in zip(layers, heads, strict=True)]
    known = ~np.isnan(values)
    fig = go.Figure()
    if (~known).any():
        fig.add_trace(
            go.Scatter(
                x=x[~known],
                y=y[~known],
                mode="markers+text",
                text=[names[i] for i in np.flatnonzero(~known)],
                textposition="top center",
                marker={"size": 14, "color": MASKED_GREY},
                customdata=np.stack([layers, heads], axis=1)[~known],
                name="not defined",
                hovertemplate=f"layer %{{customdata[0]}}, head %{{customdata[1]}}<br>{html.escape(label)}: "
                "not defined for this kind<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x[known],
            y=y[known],
            mode="markers+text",
            text=[names[i] for i in np.flatnonzero(known)],
            textposition="top center",
            marker={
                "size": 14,
                "color": values[known],
                "colorscale": MAP_COLORSCALE,
                "colorbar": {"title": {"text": html.escape(label), "side": "right"}},
                "symbol": np.where(flags[known], "diamond", "circle"),
                "line": {"width": 1, "color": "white"},
            },
            customdata=np.stack([layers, heads], axis=1)[known],
            name=statistic,
            hovertemplate=f"layer %{{customdata[0]}}, head %{{customdata[1]}}<br>{html.escape(label)}: "
            "%{marker.color:.4f}<extra></extra>",
        )
    )
    if selected is not None:
        at = np.flatnonzero((layers == selected[0]) & (heads == selected[1]))
        if at.size:
            fig.add_trace(
                go.Scatter(
                    x=x[at],
                    y=y[at],
                    mode="markers",
                    marker={"size": 26, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": HIGHLIGHT}},
                    hoverinfo="skip",
                    name=f"layer {selected[0]}, head {selected[1]}",
                )
            )
    fig.update_layout(
        title=f"{TITLES[kind]}: {n} heads, close when they attend alike",
        showlegend=False,
        height=520,
        margin={"l": 10, "r": 10, "t": 60, "b": 10},
    )
    fig.update_xaxes(title="MDS 1 (Jensen-Shannon distance between heads)", zeroline=False)
    fig.update_yaxes(title="MDS 2", zeroline=False, scaleanchor="x", scaleratio=1)
    return fig
