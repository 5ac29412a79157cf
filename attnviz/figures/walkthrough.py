"""Figure builders for the forward-pass walkthrough: data in, a plotly figure out; never Streamlit.

Matrices are drawn with one row per token (position-prefixed labels, so repeated tokens never
merge) and one column per dimension; hovering a cell gives its exact value. Attention maps reuse
`attnviz.figures.attention.attention_heatmap`.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import SCORE_COLORSCALE, above_top_labels, plotly_labels, ticks
from attnviz.lessons.walkthrough import Matrix

# The boxes of `feed_arrow`. Plotly clips an annotation's text at its box's width and never
# wraps it, so the text is wrapped here to what the box holds.
BOX_FONT = {"size": 16, "color": "#1a1a1a"}
BOX_PX, BOX_PAD, ARROW_PX = 320, 8, 90  # a box's width, its padding and the arrow's length, in pixels
CHAR_EM, LINE_EM = 0.6, 1.4  # a generous average character width and the line height, in font sizes
BOX_MARGIN = 10


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
    heatmap = go.Heatmap(
        z=values,
        x=x,
        y=y,
        colorscale=SCORE_COLORSCALE,
        zmid=0.0,
        colorbar={"title": "value"},
        hovertemplate=f"{row_axis} %{{y}}<br>{col_axis} %{{x}}<br>value %{{z:.6f}}<extra></extra>",
    )
    layout = {
        "height": max(260, min(900, 22 * R + 180)),
        **above_top_labels(title, x),
        "xaxis": {"title": col_axis, "side": "top", "tickangle": -60, **ticks(x)},
        "yaxis": {"title": row_axis, "autorange": "reversed", **ticks(y)},
    }
    return go.Figure(data=[heatmap], layout=layout)


TABLE_ROW_PX = 32  # a cell's height: one line of text up to presenter mode's 18 px, with room around it


def table_figure(table: pd.DataFrame, title: str) -> go.Figure:
    """``table`` (a stage's tokens and ids) as a plotly table under ``title``, every cell's text as it is.

    For a projector: its fonts grow with the figure's (a data frame draws its text on a canvas at a
    fixed 14 px), and rows past a height given later (presenter mode's) scroll inside the figure.
    """
    escaped = [[html.escape(str(value), quote=False) for value in table[column]] for column in table.columns]
    cells = go.Table(
        header={
            "values": [html.escape(str(c), quote=False) for c in table.columns],
            "align": "left",
            "font": {"color": "#111111"},
            "height": TABLE_ROW_PX,
        },
        cells={"values": escaped, "align": "left", "height": TABLE_ROW_PX},
    )
    layout = {
        "title": title,
        "height": TABLE_ROW_PX * (len(table) + 1) + 80,
        "margin": {"l": 10, "r": 10, "t": 60, "b": 10},
    }
    return go.Figure(data=[cells], layout=layout)


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


def wrap_label(text: str, width_px: float = BOX_PX - 2 * BOX_PAD, font_px: float = BOX_FONT["size"]) -> str:
    """``text`` escaped for plotly and broken with ``<br>`` into lines that fit ``width_px`` at ``font_px``."""
    chars = max(1, int(width_px / (CHAR_EM * font_px)))
    lines = textwrap.wrap(text, chars, break_on_hyphens=False) or [""]
    return "<br>".join(html.escape(line, quote=False) for line in lines)


def feed_arrow(source: str, target: str) -> go.Figure:
    """Two boxes and an arrow: which tensor feeds which (e.g. memory -> cross-attention K, V).

    The boxes sit at the figure's left and right edges, their text wrapped to their width, and the
    figure is as tall as the longer text: no label is cut off however long it is.
    """
    texts = [wrap_label(source), wrap_label(target)]
    lines = max(text.count("<br>") + 1 for text in texts)
    box_px = lines * LINE_EM * BOX_FONT["size"] + 2 * BOX_PAD + 2
    boxes = [
        {
            "x": x,
            "y": 0.5,
            "xanchor": anchor,
            "text": text,
            "showarrow": False,
            "bordercolor": "#444",
            "borderwidth": 1,
            "borderpad": BOX_PAD,
            "bgcolor": "#f0f4fa",
            "width": BOX_PX - 2 * BOX_PAD,
            "font": BOX_FONT,
        }
        for x, anchor, text in ((0.0, "left", texts[0]), (1.0, "right", texts[1]))
    ]
    arrow = {  # the head at the middle shifted right by half the arrow, the tail that many pixels left
        "x": 0.5,
        "y": 0.5,
        "ax": -ARROW_PX,
        "ay": 0,
        "xshift": ARROW_PX / 2,
        "text": "",
        "showarrow": True,
        "arrowhead": 3,
        "arrowsize": 1.5,
        "arrowwidth": 2,
        "arrowcolor": "#d62728",
    }
    layout = {
        "annotations": [*boxes, arrow],
        "xaxis": {"visible": False, "range": [0, 1]},
        "yaxis": {"visible": False, "range": [0, 1]},
        "height": round(max(120, box_px + 2 * BOX_MARGIN + 10)),
        "margin": {"l": BOX_MARGIN, "r": BOX_MARGIN, "t": BOX_MARGIN, "b": BOX_MARGIN},
        "plot_bgcolor": "white",
    }
    fig = go.Figure(layout=layout)
    return fig
