"""The Q-K embedding of one head as a scatter plot: queries and keys in one plane (`attnviz.qk`)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import (
    FOOT_LEGEND,
    NARROW_TICK_FONT,
    TICK_FONT,
    above_top_labels,
    check_tokens,
    kind_titles,
    label_text,
    plotly_labels,
    title_band_px,
)
from attnviz.qk import QKEmbedding

COLOUR_BY = {"position": "position in the sentence", "role": "query or key"}
ROLE_COLOURS = {"query": "#1f77b4", "key": "#ff7f0e"}
ROLE_PLURALS = {"query": "queries", "key": "keys"}
POSITION_COLORSCALE = "Viridis"
# Above this many points a trace's tokens are in the hover only: written on every point they blur.
MAX_POINT_LABELS = 40
# Query i and key i often lie close together: their tokens go on opposite sides of the markers first.
TEXT_POSITIONS = {"query": "top center", "key": "bottom center"}
# Where else a token may go when its first place would cover another token or a marker, in this order.
OTHER_POSITIONS = ("middle right", "middle left", "top right", "bottom right", "top left", "bottom left")
# Room around the outermost points, as shares of the larger span, so that their tokens stay inside.
PAD_ACROSS, PAD_UP = 0.12, 0.08
# The plot area of a figure of height h is about h - FRAME_PX tall (title, subtitle, axis title, legend).
FRAME_PX = 200
# A phone's layout: the title wrapped under plotly's toolbar, no subtitle (the page's caption says it), the
# colour bar across the foot above the legend (its own NARROW_FOOT_PX), 12 px tokens; the plot area is about
# NARROW_PLOT_PX wide (a figure of about 330 to 400 px).
NARROW_FOOT_PX, NARROW_PLOT_PX = 160, 260
MARKER_PX = 9  # marker size (diameter) while points are labelled
# A token's drawn width, per character, in units of the font size: wider than Source Sans's own letters
# (about 0.5) so that an estimate errs towards room; arrows, "▁" and other symbols take about one unit.
CHAR_EM, SYMBOL_EM, LINE_EM, GAP_PX = 0.6, 1.0, 1.25, 2.0


def qk_scatter(
    embedding: QKEmbedding,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    colour_by: str = "position",
    title: str | None = None,
    label_px: float = TICK_FONT["size"],
    height: int = 620,
    narrow: bool = False,
) -> go.Figure:
    """Queries (circles) and keys (crosses) of one head on the embedding's two principal axes.

    ``colour_by`` "position" colours each point by its token's position (a shared scale for both,
    so query i and key i have one colour), "role" colours queries and keys apart. Each point is
    labelled with its token, up to ``MAX_POINT_LABELS`` points a trace: queries above, keys below, or
    beside their marker where that would cover another token or marker (`place_labels`); a token that
    finds no free place is on hover only (`hover_only` counts them). Hover gives the role,
    position and token of every point. The axes have no units of their own: only distances mean
    something.

    The places are worked out for tokens ``label_px`` high in a figure ``height`` px tall whose plot
    area is at least as wide as it is tall (a projector's larger text and shorter picture are such a
    layout). With ``narrow`` the figure is laid out for a phone instead (`NARROW_PLOT_PX`): the title
    wraps, the subtitle is left out, the colour bar lies across the foot and the tokens are 12 px.
    """
    if colour_by not in COLOUR_BY:
        raise ValueError(f"colour_by must be one of {', '.join(COLOUR_BY)}; got {colour_by!r}")
    kind_title, query_axis, key_axis = kind_titles(kind)
    check_tokens(len(embedding.queries), query_tokens, "query")
    check_tokens(len(embedding.keys), key_tokens, "key")
    longest = max(len(query_tokens), len(key_tokens), 2) - 1
    low, high = embedding.points.min(axis=0), embedding.points.max(axis=0)
    span = float(max(high - low)) or 1.0
    x_range = [low[0] - PAD_ACROSS * span, high[0] + PAD_ACROSS * span]
    y_range = [low[1] - PAD_UP * span, high[1] + PAD_UP * span]
    query_labels, key_labels = plotly_labels(query_tokens), plotly_labels(key_tokens)
    title = title or f"{kind_title}: queries and keys"
    if narrow:  # the title wrapped under the toolbar; the caption beside the figure says what the subtitle would
        heading = above_top_labels(title, [], narrow=True)["title"]
        top = title_band_px(heading["text"], narrow=True)
        margin = {"l": 30, "r": 10, "t": top + 12, "b": NARROW_FOOT_PX}
        text_font, label_px = NARROW_TICK_FONT, NARROW_TICK_FONT["size"]
        plot_px = max(height - top - NARROW_FOOT_PX - 30, 100)
        wide = NARROW_PLOT_PX
    else:
        subtitle = (
            f"the first two principal axes keep {embedding.explained:.0%} of the spread; "
            "a key nearer a query gets more of its attention (exactly so in the full space)"
        )
        heading = {"text": title, "subtitle": {"text": subtitle}}
        margin = {"l": 40, "r": 40, "t": 110, "b": 10}
        text_font = TICK_FONT
        plot_px = wide = max(height - FRAME_PX, 100)
    places = {"query": None, "key": None}
    if len(query_tokens) <= MAX_POINT_LABELS or len(key_tokens) <= MAX_POINT_LABELS:
        # the scale: equal on both axes (scaleanchor), set by the longer padded span or the narrower side
        px = min(plot_px / (y_range[1] - y_range[0]), wide / (x_range[1] - x_range[0]))
        texts = [
            [html.unescape(label_text(label)) for label in labels] if len(labels) <= MAX_POINT_LABELS else None
            for labels in (query_labels, key_labels)
        ]
        places["query"], places["key"] = place_labels(
            [embedding.queries * px, embedding.keys * px],
            texts,
            [TEXT_POSITIONS["query"], TEXT_POSITIONS["key"]],
            label_px,
            bounds=(x_range[0] * px, x_range[1] * px, y_range[0] * px, y_range[1] * px),
        )
    traces = []
    for role, points, tokens, labels, symbol, axis in (
        ("query", embedding.queries, query_tokens, query_labels, "circle", query_axis),
        ("key", embedding.keys, key_tokens, key_labels, "x", key_axis),
    ):
        marker = {"symbol": symbol, "size": MARKER_PX if len(tokens) <= 200 else 5}
        if colour_by == "role":
            marker["color"] = ROLE_COLOURS[role]
        else:
            marker |= {
                "color": np.arange(len(tokens)),
                "colorscale": POSITION_COLORSCALE,
                "cmin": 0,
                "cmax": longest,
                "showscale": role == "query",
                "colorbar": {"title": {"text": "position"}},
            }
            if narrow:  # across the foot, above the legend: the plot keeps the phone's width
                marker["colorbar"] |= {
                    "orientation": "h", "thickness": 12, "x": 0.5, "y": -0.1, "yanchor": "top", "title_side": "top"
                }  # fmt: skip
        where = places[role]  # a place per point, None where its token is on hover only
        traces.append(
            go.Scatter(
                x=points[:, 0],
                y=points[:, 1],
                mode="markers+text" if where is not None else "markers",
                marker=marker,
                name=f"{ROLE_PLURALS[role]} ({axis.split(': ', 1)[1]})",
                text=None
                if where is None
                else [label_text(lb) if p else "" for lb, p in zip(labels, where, strict=True)],
                textposition=None if where is None else [p or TEXT_POSITIONS[role] for p in where],
                textfont=text_font,
                cliponaxis=False,
                hovertext=[f"{role}, position {label.replace(' ', ': ', 1)}" for label in labels],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    layout = {
        "title": heading,
        "height": height,
        "margin": margin,
        "font": TICK_FONT,
        "legend": FOOT_LEGEND,
        "plot_bgcolor": "white",
        "xaxis": {
            "title": "principal axis 1",
            "showgrid": False,
            "zeroline": False,
            "showticklabels": False,
            "range": x_range,
        },
        "yaxis": {
            "title": "principal axis 2",
            "showgrid": False,
            "zeroline": False,
            "showticklabels": False,
            "scaleanchor": "x",
            "scaleratio": 1,
            "range": y_range,
        },
    }
    fig = go.Figure(data=traces, layout=layout)
    return fig


def hover_only(fig: go.Figure) -> int:
    """How many of a `qk_scatter` figure's labelled points have their token on hover only."""
    return sum(text == "" for trace in fig.data if trace.text is not None for text in trace.text)


def _text_width(text: str, px: float) -> float:
    """An upper estimate of ``text``'s drawn width at a font ``px`` high."""
    return px * sum(CHAR_EM if ch.isascii() else SYMBOL_EM for ch in text)


def _box(x: float, y: float, position: str, width: float, height: float) -> tuple[float, float, float, float]:
    """(left, right, bottom, top) of a token placed at ``position`` by a marker at (x, y), y upwards, px."""
    r = MARKER_PX / 2 + GAP_PX
    vertical, horizontal = position.split()
    side = r if vertical == "middle" else 0  # beside the marker, or above or below it and off to one side
    left = {"center": x - width / 2, "right": x + side, "left": x - side - width}[horizontal]
    bottom = {"top": y + r, "bottom": y - r - height, "middle": y - height / 2}[vertical]
    return left, left + width, bottom, bottom + height


def _overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def place_labels(
    points: Sequence[np.ndarray],
    texts: Sequence[Sequence[str] | None],
    first: Sequence[str],
    px: float,
    bounds: tuple[float, float, float, float],
) -> list[list[str | None] | None]:
    """Where each point's token goes, so that no two tokens and no token and marker overlap.

    ``points``: one (n, 2) array per trace, in pixels (y upwards); ``texts``: each trace's tokens (None:
    that trace is not labelled); ``first``: each trace's preferred plotly text position; ``px``: the
    font size; ``bounds``: (left, right, bottom, top) that a token must stay within. Greedy, position
    by position across the traces (query 0, key 0, query 1, ...): each token takes the first of its
    preferred place and `OTHER_POSITIONS` that is free, or None (hover only) where none is. Returns
    per trace a place per point, or None for a trace without tokens.
    """
    height = LINE_EM * px
    markers = [
        (x - MARKER_PX / 2, x + MARKER_PX / 2, y - MARKER_PX / 2, y + MARKER_PX / 2) for t in points for x, y in t
    ]
    placed: list[tuple[float, float, float, float]] = []
    out: list[list[str | None] | None] = [None if t is None else [None] * len(t) for t in texts]
    longest = max((len(t) for t in texts if t is not None), default=0)
    for i in range(longest):
        for trace, tokens, preferred, where in zip(points, texts, first, out, strict=True):
            if tokens is None or i >= len(tokens):
                continue
            if not tokens[i].strip():  # nothing to draw: nothing to hide either
                where[i] = preferred
                continue
            x, y = trace[i]
            width = _text_width(tokens[i], px)
            for position in (preferred, *(p for p in (*TEXT_POSITIONS.values(), *OTHER_POSITIONS) if p != preferred)):
                box = _box(float(x), float(y), position, width, height)
                inside = bounds[0] <= box[0] and box[1] <= bounds[1] and bounds[2] <= box[2] and box[3] <= bounds[3]
                if inside and not any(_overlaps(box, other) for other in (*placed, *markers)):
                    placed.append(box)
                    where[i] = position
                    break
    return out
