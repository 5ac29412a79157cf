"""The Q-K embedding of one head as a scatter plot: queries and keys in one plane (:mod:`attnviz.qk`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import check_tokens, kind_titles, plotly_labels
from attnviz.qk import QKEmbedding

COLOUR_BY = {"position": "position in the sentence", "role": "query or key"}
ROLE_COLOURS = {"query": "#1f77b4", "key": "#ff7f0e"}
POSITION_COLORSCALE = "Viridis"


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
    so query i and key i have one colour), "role" colours queries and keys apart. Hover gives the
    role, position and token. The axes have no units of their own: only distances mean something.
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
        traces.append(
            go.Scatter(
                x=points[:, 0],
                y=points[:, 1],
                mode="markers",
                marker=marker,
                name=f"{role}s ({axis.split(': ', 1)[1]})",
                text=plotly_labels(tokens),
                hovertemplate=f"{role} %{{text}}<extra></extra>",
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
        margin={"l": 10, "r": 10, "t": 110, "b": 10},
        legend={"orientation": "h", "y": -0.05},
        plot_bgcolor="white",
    )
    fig.update_xaxes(title="principal axis 1", showgrid=False, zeroline=False, showticklabels=False)
    fig.update_yaxes(
        title="principal axis 2", showgrid=False, zeroline=False, showticklabels=False, scaleanchor="x", scaleratio=1
    )
    return fig
