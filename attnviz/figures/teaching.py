"""Figure builders for the teaching pages (mechanics and attention variants): data in, plotly out.

Like every figure they never call Streamlit, every axis has a title, and token labels are prefixed
with their position (`attnviz.figures.common.plotly_labels`) so repeated tokens never merge.
Matrices are drawn with rows as queries and columns as keys, row 0 at the top.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.common import (
    FOOT_LEGEND,
    HIGHLIGHT,
    MASKED_GREY,
    WEIGHT_COLORSCALE,
    plotly_labels,
    vertical_line,
)

ALLOWED_BLUE = "#2171b5"
SCALED, UNSCALED = "#2171b5", HIGHLIGHT  # with and without 1/sqrt(d_k), the same on every chart
MARGIN = {"l": 10, "r": 10, "t": 60, "b": 10}


def _subplot(i: int) -> str:
    """How the i-th subplot's axes are named after "x" and "y", row by row: x and y, x2 and y2, ..."""
    return str(i + 1) if i else ""


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    if labels is None:
        return [str(i) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} rows or columns: give one per position")
    return plotly_labels(labels)


def _mask_trace(mask: np.ndarray, x: list[str], y: list[str], showscale: bool, legend: tuple[str, str]) -> go.Heatmap:
    return go.Heatmap(
        z=mask.astype(np.int8),
        x=x,
        y=y,
        zmin=0,
        zmax=1,
        colorscale=[[0.0, MASKED_GREY], [0.5, MASKED_GREY], [0.5, ALLOWED_BLUE], [1.0, ALLOWED_BLUE]],
        showscale=showscale,
        colorbar={"tickvals": [0.25, 0.75], "ticktext": list(legend), "title": ""},
        xgap=1 if len(x) <= 64 else 0,
        ygap=1 if len(y) <= 64 else 0,
        customdata=np.where(mask, legend[1], legend[0]),
        hovertemplate="query %{y}<br>key %{x}<br>%{customdata}<extra></extra>",
    )


def mask_grid(
    masks: dict[str, np.ndarray],
    cols: int = 3,
    x_title: str = "key position",
    y_title: str = "query position",
    height_per_row: int = 300,
    legend: tuple[str, str] = ("masked", "may attend"),
) -> go.Figure:
    """Boolean (n, n) masks side by side, titled by their keys: blue True, grey False.

    ``legend`` names False and True (for masks: masked, may attend). Subplots in a row share their
    query axis, so its tick labels and title are drawn once, on the left.
    """
    if not masks:
        raise ValueError("no masks to draw")
    cols = min(cols, len(masks))
    rows = math.ceil(len(masks) / cols)
    traces, layout = [], {"height": height_per_row * rows + 80, "margin": MARGIN}
    for i, mask in enumerate(masks.values()):
        mask = np.asarray(mask, dtype=bool)
        if mask.ndim != 2:
            raise ValueError(f"each mask must be (queries, keys), got shape {mask.shape}")
        x, y = [str(j) for j in range(mask.shape[1])], [str(j) for j in range(mask.shape[0])]
        n = _subplot(i)
        traces.append(_mask_trace(mask, x, y, showscale=i == 0, legend=legend).update(xaxis=f"x{n}", yaxis=f"y{n}"))
        layout[f"xaxis{n}"] = {"title": x_title, "type": "category"}
        # The row's panels share one query axis: titled once, on the left, where its labels are.
        layout[f"yaxis{n}"] = {"type": "category", "autorange": "reversed"}
        if i % cols == 0:
            layout[f"yaxis{n}"]["title"] = y_title
    return make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=list(masks),
        horizontal_spacing=0.05,
        shared_yaxes=True,
        figure=go.Figure(data=traces, layout=layout),
    )


def masked_row_bars(table: pd.DataFrame, query: int) -> go.Figure:
    """One query's weights without and with a mask (from `attnviz.lessons.mechanics.apply_mask_to_row`)."""
    keys = [f"{k}{'' if ok else ' (masked)'}" for k, ok in zip(table["key"], table["may attend"], strict=True)]
    return go.Figure(
        data=[
            go.Bar(x=keys, y=table["weight without mask"], name="without mask", marker_color=MASKED_GREY),
            go.Bar(x=keys, y=table["weight with mask"], name="with mask", marker_color=ALLOWED_BLUE),
        ],
        layout={
            "title": f"Query {query}: softmax weights before and after masking",
            "barmode": "group",
            "margin": MARGIN,
            "xaxis": {"title": "key position", "type": "category"},
            "yaxis": {"title": "weight (the row sums to 1)", "range": [0, 1]},
        },
    )


def scaling_figure(df: pd.DataFrame) -> go.Figure:
    """Four panels against d_k (log scale): variance of q·k, entropy, largest weight, softmax gradient norm."""
    both = lambda stem: [(f"{stem}, scaled", SCALED, "scaled"), (f"{stem}, unscaled", UNSCALED, "unscaled")]
    variance = [("variance of q·k", UNSCALED, "unscaled"), ("variance of q·k / √d_k", SCALED, "scaled")]
    panels = [
        ("Variance of q·k", "variance (log scale)", variance),
        ("Softmax entropy", "entropy (nats)", both("entropy")),
        ("Largest weight", "mean largest weight", both("largest weight")),
        ("Softmax gradient", "‖diag(p) − p pᵀ‖", both("softmax gradient norm")),
    ]
    traces, layout = [], {"height": 640, "margin": MARGIN}
    for i, (_, y_title, series) in enumerate(panels):
        n = _subplot(i)
        for column, color, name in series:
            traces.append(
                go.Scatter(
                    x=df["d_k"],
                    y=df[column],
                    name=name,
                    mode="lines+markers",
                    line={"color": color},
                    legendgroup=name,
                    showlegend=i == 0,
                    xaxis=f"x{n}",
                    yaxis=f"y{n}",
                )
            )
        layout[f"xaxis{n}"] = {"title": "d_k (log scale)", "type": "log"}
        layout[f"yaxis{n}"] = {"title": y_title, "type": "log" if i == 0 else "linear"}
    hline = "uniform_entropy" in df.attrs
    if hline:  # a dotted line across the entropy panel, as add_hline draws it
        uniform = df.attrs["uniform_entropy"]
        line = {"xref": "x2 domain", "yref": "y2", "y0": uniform, "y1": uniform}
        layout["shapes"] = [{"type": "line", "x0": 0, "x1": 1, "line": {"dash": "dot"}, **line}]
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[p[0] for p in panels],
        vertical_spacing=0.16,
        figure=go.Figure(data=traces, layout=layout),
    )
    if hline:  # its label after the subplot titles, which make_subplots writes over any annotations
        note = {"text": "uniform (log n_keys)", "showarrow": False, "x": 1, "xanchor": "right", "yanchor": "bottom"}
        fig.layout.annotations += ({**note, "xref": "x2 domain", "yref": "y2", "y": uniform},)
    return fig


def query_weights_bars(weights: np.ndarray, d_k: int, scale: bool) -> go.Figure:
    """One query's softmax weights over its keys as bars, titled by d_k, the scaling and the largest weight."""
    how = "scores / √d_k" if scale else "raw scores q·k (no scaling)"
    keys = [f"key {j}" for j in range(len(weights))]
    return go.Figure(
        data=[go.Bar(x=keys, y=weights, marker_color=SCALED if scale else UNSCALED)],
        layout={
            "title": f"One query, d_k = {d_k}, softmax of {how}: largest weight {float(np.max(weights)):.3f}",
            "margin": MARGIN,
            "height": 320,
            "xaxis": {"title": "key"},
            "yaxis": {"title": "weight", "range": [0, 1]},
        },
    )


def lr_curve(df: pd.DataFrame, warmup: int) -> go.Figure:
    """Equation 3's learning rate against the training step, the end of warm-up marked."""
    end, note = vertical_line(warmup, f"warmup_steps = {warmup}", {"dash": "dot"})  # the end of warm-up
    return go.Figure(
        data=[go.Scatter(x=df["step"], y=df["learning rate"], mode="lines", line={"color": ALLOWED_BLUE})],
        layout={
            "title": "lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)",
            "margin": MARGIN,
            "shapes": [end],
            "annotations": [note],
            "xaxis": {"title": "training step"},
            "yaxis": {"title": "learning rate", "exponentformat": "e"},
        },
    )


def cost_figure(df: pd.DataFrame, k: int) -> go.Figure:
    """Computed (query, key) pairs against n for each pattern, log-log (from ``variants.cost_curves``)."""
    return go.Figure(
        data=[
            go.Scatter(x=part["n"], y=part["pairs"], name=f"{name}: {order}", mode="lines+markers")
            for (name, order), part in df.groupby(["pattern", "order"], sort=False)
        ],
        layout={
            "title": f"Cost of one attention map, k = {k}",
            "margin": MARGIN,
            "xaxis": {"title": "sequence length n (log scale)", "type": "log"},
            "yaxis": {"title": "computed (query, key) pairs (log scale)", "type": "log"},
        },
    )


def timing_figure(df: pd.DataFrame) -> go.Figure:
    """Measured median milliseconds per layer against n (from ``variants.time_self_attention_vs_gru``)."""
    return go.Figure(
        data=[
            go.Scatter(x=part["n"], y=part["median ms"], name=name, mode="lines+markers", line={"color": color})
            for (name, part), color in zip(df.groupby("layer", sort=False), (SCALED, UNSCALED), strict=False)
        ],
        layout={
            "title": "One layer on one sequence, measured on this machine",
            "margin": MARGIN,
            "xaxis": {"title": "sequence length n (log scale)", "type": "log"},
            "yaxis": {"title": "median time (ms, log scale)", "type": "log"},
        },
    )


def head_cost_bars(df: pd.DataFrame) -> go.Figure:
    """Parameters and multiply-adds of narrow against wide heads (from ``mechanics.narrow_vs_wide_cost``)."""
    measures = ["parameters", "multiply-adds: total"]
    return go.Figure(
        data=[
            go.Bar(x=measures, y=[row[m] for m in measures], name=row["attention"], marker_color=color)
            for row, color in zip(df.to_dict("records"), (ALLOWED_BLUE, HIGHLIGHT), strict=False)
        ],
        layout={
            "title": "One self-attention layer: narrow against wide heads",
            "barmode": "group",
            "margin": MARGIN,
            "legend": FOOT_LEGEND,
            "xaxis": {"title": "what is counted"},
            "yaxis": {"title": "count (log scale)", "type": "log"},
        },
    )


def heatmap_row(
    matrices: dict[str, np.ndarray],
    labels: Sequence[str] | None = None,
    x_title: str = "key",
    y_title: str = "query",
    weights: bool = True,
    height: int = 360,
) -> go.Figure:
    """Square matrices side by side on one colour scale (0..1 for weights), titled by their keys.

    They share the query axis: one set of labels and one title, on the left.
    """
    if not matrices:
        raise ValueError("no matrices to draw")
    values = [np.asarray(m, dtype=np.float64) for m in matrices.values()]
    zmin, zmax = (0.0, 1.0) if weights else (min(v.min() for v in values), max(v.max() for v in values))
    traces, layout = [], {"height": height, "margin": MARGIN}
    for i, z in enumerate(values):
        x, y = _labels(labels, z.shape[1]), _labels(labels, z.shape[0])
        n = _subplot(i)
        traces.append(
            go.Heatmap(
                z=z,
                x=x,
                y=y,
                zmin=zmin,
                zmax=zmax,
                colorscale=WEIGHT_COLORSCALE,
                showscale=i == 0,
                colorbar={"title": "weight" if weights else "value"},
                hovertemplate=f"{y_title} %{{y}}<br>{x_title} %{{x}}<br>%{{z:.6f}}<extra></extra>",
                xaxis=f"x{n}",
                yaxis=f"y{n}",
            )
        )
        layout[f"xaxis{n}"] = {"title": x_title, "type": "category"}
        layout[f"yaxis{n}"] = {"type": "category", "autorange": "reversed"}
    layout["yaxis"]["title"] = y_title  # the shared query axis, on the left
    return make_subplots(
        rows=1,
        cols=len(matrices),
        subplot_titles=list(matrices),
        horizontal_spacing=0.04,
        shared_yaxes=True,
        figure=go.Figure(data=traces, layout=layout),
    )


def permutation_figure(
    permuted_map: np.ndarray, expected_map: np.ndarray, permuted_tokens: Sequence[str], title: str
) -> go.Figure:
    """A(P x), P A(x) P^T and their absolute difference for one head, labelled by the shuffled tokens."""
    a, b = np.asarray(permuted_map, dtype=np.float64), np.asarray(expected_map, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"the two maps differ in shape: {a.shape} and {b.shape}")
    fig = heatmap_row(
        {"A(P x): shuffled input": a, "P A(x) Pᵀ: shuffled map": b, "|difference|": np.abs(a - b)},
        labels=permuted_tokens,
        x_title="key: shuffled source token",
        y_title="query: shuffled source token",
        height=max(360, min(700, 22 * a.shape[0] + 200)),
    )
    fig.layout.title = title  # one property: update_layout would lay the whole figure out again
    return fig
