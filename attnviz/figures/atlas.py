"""Figures of the head atlas: the heads of one kind as points on a 2-D map, coloured by a statistic.

The map's coordinates come from classical MDS of the Jensen-Shannon distances between heads
(``mds.parquet``): heads close together attend alike over the corpus. The axes have no units of
their own; only distances on the map mean something. A head's own map for one sentence is drawn
with `attnviz.figures.attention.attention_heatmap`.

Heads that attend alike sit close together, so their names would print over each other: a name
goes above or below its point where it clears every name already placed and every other point,
the selected head's first; a head left without one is named in its hover.
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import HIGHLIGHT, MASKED_GREY, TICK_FONT
from attnviz.kinds import TITLES, check_kind

# What each statistic measures, with its unit: colour bar titles, captions and docs/atlas.md agree.
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
MARKER_PX = 14
# Where names are placed, in pixels: the map's plot area is at least MAP_PX square (the figure's
# height less its title and axis bands; a wider page only spreads the points further apart), a
# 14 px name takes about CHAR_PX a character and LINE_PX a line, and sits OFFSET_PX off its point.
MAP_PX, CHAR_PX, LINE_PX = 380, 8.5, 18
OFFSET_PX = MARKER_PX / 2 + 2 + LINE_PX / 2
EDGE_PX = OFFSET_PX + LINE_PX / 2 + 4  # the room around the outermost points: their names stay inside
PLACES = {"top center": 1, "bottom center": -1}  # a name's side of its point: above, else below


def map_range(x: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float], float]:
    """(x range, y range, pixels per unit): equal-length ranges round the points, with EDGE_PX to spare."""
    span = max(float(np.ptp(x)), float(np.ptp(y))) if len(x) else 0.0
    span = span or 1.0
    scale = (MAP_PX - 2 * EDGE_PX) / span
    half = span / 2 + EDGE_PX / scale
    cx, cy = (float(np.min(a) + np.max(a)) / 2 if len(a) else 0.0 for a in (x, y))
    return [cx - half, cx + half], [cy - half, cy + half], scale


def label_places(names: list[str], x: np.ndarray, y: np.ndarray, scale: float, first: int | None = None) -> list[str]:
    """Each name's textposition (a key of PLACES), or "" where it would cover another name or point.

    Greedy, in order: a name goes above its point if that clears every name placed so far and every
    other marker, else below, else nowhere (the hover still names it). ``first`` (the selected head)
    goes first and is always named, above, even where that covers a marker in a tight cluster.
    """
    px, py = np.asarray(x) * scale, np.asarray(y) * scale
    order = list(range(len(names)))
    if first is not None:
        order.insert(0, order.pop(first))
    placed: list[tuple[float, float, float]] = []  # (centre x, centre y, half width) of each name shown
    places = [""] * len(names)
    reach = MARKER_PX / 2 + LINE_PX / 2  # a name's centre this close (vertically) to a marker covers it
    for i in order:
        half = len(names[i]) * CHAR_PX / 2
        others = np.arange(len(names)) != i
        for place, side in PLACES.items():
            cx, cy = px[i], py[i] + side * OFFSET_PX
            clear_names = all(abs(cx - ox) >= half + oh or abs(cy - oy) >= LINE_PX for ox, oy, oh in placed)
            covers = (np.abs(px[others] - cx) < half + MARKER_PX / 2) & (np.abs(py[others] - cy) < reach)
            if clear_names and (i == first or not covers.any()):
                places[i] = place
                placed.append((cx, cy, half))
                break
    return places


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
    x_range, y_range, scale = map_range(x, y)
    at = np.array([], dtype=int)
    if selected is not None:
        at = np.flatnonzero((layers == selected[0]) & (heads == selected[1]))
    places = label_places(names, x, y, scale, first=int(at[0]) if at.size else None)
    shown = [name if place else "" for name, place in zip(names, places, strict=True)]
    known = ~np.isnan(values)
    traces = []
    if (~known).any():
        traces.append(
            go.Scatter(
                x=x[~known],
                y=y[~known],
                mode="markers+text",
                text=[shown[i] for i in np.flatnonzero(~known)],
                textposition=[places[i] or "top center" for i in np.flatnonzero(~known)],
                textfont=TICK_FONT,
                cliponaxis=False,
                marker={"size": MARKER_PX, "color": MASKED_GREY},
                customdata=np.stack([layers, heads], axis=1)[~known],
                name="not defined",
                hovertemplate=f"layer %{{customdata[0]}}, head %{{customdata[1]}}<br>{html.escape(label)}: "
                "not defined for this kind<extra></extra>",
            )
        )
    traces.append(
        go.Scatter(
            x=x[known],
            y=y[known],
            mode="markers+text",
            text=[shown[i] for i in np.flatnonzero(known)],
            textposition=[places[i] or "top center" for i in np.flatnonzero(known)],
            textfont=TICK_FONT,
            cliponaxis=False,
            marker={
                "size": MARKER_PX,
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
    if at.size:
        traces.append(
            go.Scatter(
                x=x[at],
                y=y[at],
                mode="markers",
                marker={"size": 26, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": HIGHLIGHT}},
                hoverinfo="skip",
                name=f"layer {selected[0]}, head {selected[1]}",
            )
        )
    layout = {
        "title": f"{TITLES[kind]}: {n} heads, close when they attend alike",
        "showlegend": False,
        "height": 520,
        "margin": {"l": 10, "r": 10, "t": 60, "b": 10},
        "font": TICK_FONT,
        "xaxis": {"title": "MDS 1 (Jensen-Shannon distance between heads)", "zeroline": False, "range": x_range},
        "yaxis": {"title": "MDS 2", "zeroline": False, "scaleanchor": "x", "scaleratio": 1, "range": y_range},
    }
    fig = go.Figure(data=traces, layout=layout)
    return fig
