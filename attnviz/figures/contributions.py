"""Figures of what lies beyond the weights: contribution maps, propagated relevance, head importance.

Plain data in (numpy arrays, token lists), a plotly figure out. Rows are queries and columns keys,
as in every map; layers and heads are numbered from 1, positions from 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import HIGHLIGHT, MAX_TICK_CHARS, as_array, check_tokens, plotly_labels, shortened
from attnviz.kinds import TITLES

CONTRIBUTION_COLORSCALE = "Purples"  # not the weights' Blues: a contribution is not a weight
IMPORTANCE_COLORSCALE = "RdBu"  # diverging around 0: red helps (positive), blue hurts
IMPORTANCE_ROW_PX = 44  # the height of one layer's row of the importance grid


def contribution_heatmap(
    values: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    value_name: str,
    title: str | None = None,
    mask: np.ndarray | None = None,
    zmax: float | None = None,
) -> go.Figure:
    """A (Q, K) map of a contribution method, drawn like a head's map but on its own scale.

    The colour scale runs from 0 to ``zmax`` (default: the largest value; 1 for shares), so that
    norms, which have no upper bound, stay readable; masked cells are grey as in the maps. The
    colour bar and the hover name the quantity (``value_name``).
    """
    values = as_array(values, "values", 2)
    top = float(np.nanmax(values, initial=0.0)) if zmax is None else float(zmax)
    fig = attention_heatmap(values, query_tokens, key_tokens, kind, title=title, mask=mask)
    fig.update_traces(
        selector={"name": "weight"},
        zmin=0.0,
        zmax=top if top > 0 else 1.0,
        colorscale=CONTRIBUTION_COLORSCALE,
        # the weights' ticks (0 to 1) out: plotly places its own along 0..zmax
        colorbar={"title": {"text": value_name}, "tickvals": None, "ticktext": None},
        name=value_name,
        hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{value_name} %{{z:.6f}}<extra></extra>",
    )
    return fig


def relevance_bars(
    source_tokens: Sequence[str] | None,
    source_relevance: np.ndarray | None,
    target_tokens: Sequence[str],
    target_relevance: np.ndarray,
    explained: str,
) -> go.Figure:
    """Bar charts side by side: each source token's and each decoder input token's relevance.

    ``explained`` names the prediction, e.g. "'ein' predicted at decoder position 2". A language
    model has no source: with ``source_tokens`` and ``source_relevance`` None, one chart of its tokens.
    """
    if (source_tokens is None) != (source_relevance is None):
        raise ValueError("give the source's tokens and relevance together, or neither (a language model)")
    sides = [("tokens", "target", target_tokens, target_relevance)]  # (title, axis, tokens, relevance)
    if source_tokens is not None:
        sides = [
            ("source tokens", "source", source_tokens, source_relevance),
            ("decoder input tokens", "target", target_tokens, target_relevance),
        ]
    sides = [(title, tokens, as_array(r, f"{axis}_relevance", 1), axis) for title, axis, tokens, r in sides]
    for _, tokens, relevance, axis in sides:
        check_tokens(len(relevance), tokens, axis)
    fig = make_subplots(rows=1, cols=len(sides), subplot_titles=[title for title, *_ in sides])
    for col, (_, tokens, relevance, _) in enumerate(sides, start=1):
        labels = plotly_labels(tokens)
        fig.add_trace(
            go.Bar(
                x=relevance,
                y=labels,
                orientation="h",
                marker={"color": "#6a51a3"},
                hovertemplate="%{y}<br>relevance %{x:.6f}<extra></extra>",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
        ticktext = [shortened(label, MAX_TICK_CHARS) for label in labels]  # the hover keeps the whole label
        fig.update_yaxes(type="category", autorange="reversed", tickvals=labels, ticktext=ticktext, row=1, col=col)
        fig.update_xaxes(title="relevance", row=1, col=col)
    fig.update_layout(
        title=f"Relevance for {explained}",
        height=160 + 22 * max(len(tokens) for _, tokens, *_ in sides),
        margin={"l": 10, "r": 10, "t": 90, "b": 10},
    )
    return fig


def importance_grid(scores: np.ndarray, kind: str, selected: tuple[int, int] | None = None) -> go.Figure:
    """Head importance of one kind (L, H) as a layers x heads grid whose cells can be clicked.

    The colours are a heatmap on a scale symmetric around 0 (red: the output is less likely without
    the head; blue: more likely). Clicks need points (Streamlit reports no selection on a heatmap),
    so an invisible marker sits at the centre of every cell with ``customdata`` (layer, head), from
    1, and a click anywhere picks the nearest marker (no hover distance limit): that cell's.
    ``selected`` (layer, head) is outlined.
    """
    scores = as_array(scores, "scores", 2)
    L, H = scores.shape
    layers, heads = np.meshgrid(np.arange(1, L + 1), np.arange(1, H + 1), indexing="ij")  # (L, H) each
    limit = float(np.abs(scores).max(initial=0.0)) or 1e-9
    x = [str(h) for h in range(1, H + 1)]
    y = [str(layer) for layer in range(1, L + 1)]
    cells = go.Heatmap(
        z=scores,
        x=x,
        y=y,
        zmin=-limit,
        zmax=limit,
        colorscale=IMPORTANCE_COLORSCALE,
        reversescale=True,  # RdBu runs red to blue; red for "matters" reads better
        colorbar={"title": "drop in<br>log-prob<br>per token"},
        text=np.vectorize(lambda v: f"{v:.3f}")(scores),
        texttemplate="%{text}",
        hoverinfo="skip",
        name="importance",
    )
    markers = go.Scatter(
        x=[x[h - 1] for h in heads.ravel()],
        y=[y[layer - 1] for layer in layers.ravel()],
        mode="markers",
        marker={"size": 6, "opacity": 0.0, "color": "#000000"},
        customdata=np.stack([layers.ravel(), heads.ravel()], axis=1),
        text=[f"{v:.4f}" for v in scores.ravel()],
        hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<br>"
        "drop in log-probability per token: %{text}<extra>click: switch this head off</extra>",
        name="cells",
        showlegend=False,
    )
    layout = {
        "xaxis": {"type": "category", "side": "top", "title": {"text": "head", "standoff": 4}, "tickangle": 0},
        "yaxis": {"type": "category", "autorange": "reversed", "title": "layer"},
        "title": {"text": TITLES[kind], "y": 0.98, "yanchor": "top"},
        "height": 130 + IMPORTANCE_ROW_PX * L,
        "margin": {"l": 10, "r": 10, "t": 100, "b": 10},
        "clickmode": "event+select",
        "hoverdistance": -1,  # a click anywhere in a cell picks that cell's marker, the nearest
    }
    if selected is not None:
        layer, head = selected
        if not (1 <= layer <= L and 1 <= head <= H):
            raise ValueError(f"selected is (layer, head) from 1; the grid has {L} layers and {H} heads, got {selected}")
        layout["shapes"] = [
            {
                "type": "rect",
                "x0": head - 1.5,
                "x1": head - 0.5,
                "y0": layer - 1.5,
                "y1": layer - 0.5,
                "line": {"color": HIGHLIGHT, "width": 3},
            }
        ]
    fig = go.Figure(data=[cells, markers], layout=layout)
    return fig
