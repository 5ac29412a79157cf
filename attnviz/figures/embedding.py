"""The Q-K embedding of one head as a scatter plot: queries and keys in one plane (`attnviz.qk`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import FOOT_LEGEND, TICK_FONT, check_tokens, kind_titles, label_text, plotly_labels
from attnviz.qk import QKEmbedding

COLOUR_BY = {"position": "position in the sentence", "role": "query or key"}
ROLE_COLOURS = {"query": "#1f77b4", "key": "#ff7f0e"}
ROLE_PLURALS = {"query": "queries", "key": "keys"}
POSITION_COLORSCALE = "Viridis"
# Above this many points a trace's tokens are in the hover only: written on every point they blur.
MAX_POINT_LABELS = 40
# Query i and key i often lie close together: their tokens go on opposite sides of the markers.
TEXT_POSITIONS = {"query": "top center", "key": "bottom center"}
# Room around the outermost points, as shares of the larger span, so that their tokens stay inside.
PAD_ACROSS, PAD_UP = 0.12, 0.08


def qk_scatter(
    embedding: QKEmbedding,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    colour_by: str = "position",
    title: str | None = None,
) -> go.Figure:
    """Queries (circles) and keys (crosses) of one head on the embedding's two principal axes.

    ``colour_by`` "position" colours each point by its token's position (a shared scale for both,
    so query i and key i have one colour), "role" colours queries and keys apart. Each point is
    labelled with its token (queries above, keys below), up to ``MAX_POINT_LABELS`` points a trace;
    hover gives the role, position and token. The axes have no units of their own: only distances
    mean something.
    """
    if colour_by not in COLOUR_BY:
        raise ValueError(f"colour_by must be one of {', '.join(COLOUR_BY)}; got {colour_by!r}")
    kind_title, query_axis, key_axis = kind_titles(kind)
    check_tokens(len(embedding.queries), query_tokens, "query")
    check_tokens(len(embedding.keys), key_tokens, "key")
    longest = max(len(query_tokens), len(key_tokens), 2) - 1
    traces = []
    for role, points, tokens, symbol, axis in (
        ("query", embedding.queries, query_tokens, "circle", query_axis),
        ("key", embedding.keys, key_tokens, "x", key_axis),
    ):
        marker = {"symbol": symbol, "size": 9 if len(tokens) <= 200 else 5}
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
        labels, labelled = plotly_labels(tokens), len(tokens) <= MAX_POINT_LABELS
        traces.append(
            go.Scatter(
                x=points[:, 0],
                y=points[:, 1],
                mode="markers+text" if labelled else "markers",
                marker=marker,
                name=f"{ROLE_PLURALS[role]} ({axis.split(': ', 1)[1]})",
                text=[label_text(label) for label in labels] if labelled else None,
                textposition=TEXT_POSITIONS[role],
                textfont=TICK_FONT,
                cliponaxis=False,
                hovertext=[f"{role}, position {label.replace(' ', ': ', 1)}" for label in labels],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    fig = go.Figure(traces)
    fig.update_layout(
        title={
            "text": title or f"{kind_title}: queries and keys",
            "subtitle": {
                "text": f"the first two principal axes keep {embedding.explained:.0%} of the spread; "
                "a key nearer a query gets more of its attention (exactly so in the full space)"
            },
        },
        height=620,
        margin={"l": 40, "r": 40, "t": 110, "b": 10},
        font=TICK_FONT,
        legend=FOOT_LEGEND,
        plot_bgcolor="white",
    )
    low, high = embedding.points.min(axis=0), embedding.points.max(axis=0)
    span = float(max(high - low)) or 1.0
    fig.update_xaxes(
        title="principal axis 1",
        showgrid=False,
        zeroline=False,
        showticklabels=False,
        range=[low[0] - PAD_ACROSS * span, high[0] + PAD_ACROSS * span],
    )
    fig.update_yaxes(
        title="principal axis 2",
        showgrid=False,
        zeroline=False,
        showticklabels=False,
        scaleanchor="x",
        scaleratio=1,
        range=[low[1] - PAD_UP * span, high[1] + PAD_UP * span],
    )
    return fig
