"""Figure builders for the forward-pass walkthrough: data in, a plotly figure out; never Streamlit.

Matrices are drawn with one row per token (position-prefixed labels, so repeated tokens never
merge) and one column per dimension; hovering a cell gives its exact value. Attention maps reuse
:func:`attnviz.figures.attention.attention_heatmap`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import SCORE_COLORSCALE, above_top_labels, plotly_labels, ticks
from attnviz.lessons.walkthrough import Matrix


def matrix_heatmap(
    values: np.ndarray,
    row_labels: Sequence[str],
    row_axis: str,
    col_axis: str,
    title: str,
    col_labels: Sequence[str] | None = None,
) -> go.Figure:
    """A (rows, columns) matrix as a heatmap on a diverging scale centred at 0, values on hover.

    Rows are labelled with their tokens (position-prefixed); columns are numbered dimensions unless
    ``col_labels`` are given.
    """
    values = np.asarray(values, dtype=np.float32)
    if values.ndim != 2:
        raise ValueError(f"values must have 2 axes, got shape {values.shape}")
    R, C = values.shape
    if len(row_labels) != R:
        raise ValueError(f"{len(row_labels)} row labels for {R} rows")
    y = plotly_labels(row_labels)
    x = plotly_labels(col_labels) if col_labels is not None else [f"dim {j}" for j in range(C)]
    if len(x) != C:
        raise ValueError(f"{len(x)} column labels for {C} columns")
    fig = go.Figure(
        go.Heatmap(
            z=values,
            x=x,
            y=y,
            colorscale=SCORE_COLORSCALE,
            zmid=0.0,
            colorbar={"title": "value"},
            hovertemplate=f"{row_axis} %{{y}}<br>{col_axis} %{{x}}<br>value %{{z:.6f}}<extra></extra>",
        )
    )
    fig.update_layout(height=max(260, min(900, 22 * R + 180)), **above_top_labels(title, x))
    fig.update_xaxes(title=col_axis, side="top", tickangle=-60, **ticks(x))
    fig.update_yaxes(title=row_axis, autorange="reversed", **ticks(y))
    return fig


def matrix_figure(matrix: Matrix, k: int) -> go.Figure:
    """A stage's matrix: an attention map (all keys) or its first ``k`` columns as a heatmap."""
    if matrix.style in ("weights", "scores"):
        return attention_heatmap(
            matrix.values,
            matrix.row_labels,
            matrix.col_labels,
            matrix.attention_kind,
            title=matrix.title,
            mask=matrix.mask,
            scores=matrix.style == "scores",
        )
    cols = None if matrix.col_labels is None else matrix.col_labels[:k]
    return matrix_heatmap(
        matrix.values[:, :k], matrix.row_labels, matrix.row_axis, matrix.col_axis, matrix.title, col_labels=cols
    )


def feed_arrow(source: str, target: str) -> go.Figure:
    """Two boxes and an arrow: which tensor feeds which (e.g. memory -> cross-attention K, V)."""
    fig = go.Figure()
    for x, text in ((0.18, source), (0.82, target)):
        fig.add_annotation(
            x=x,
            y=0.5,
            text=text,
            showarrow=False,
            bordercolor="#444",
            borderwidth=1,
            borderpad=8,
            bgcolor="#f0f4fa",
            width=260,
            font={"size": 13},
        )
    fig.add_annotation(
        x=0.64,
        y=0.5,
        ax=0.36,
        ay=0.5,
        xref="x",
        yref="y",
        axref="x",
        ayref="y",
        text="",
        showarrow=True,
        arrowhead=3,
        arrowsize=1.5,
        arrowwidth=2,
        arrowcolor="#d62728",
    )
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0, 1])
    fig.update_layout(height=120, margin={"l": 10, "r": 10, "t": 10, "b": 10}, plot_bgcolor="white")
    return fig
