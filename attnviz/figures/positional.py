"""Figure builders for the positional-encoding pages: plain data in, a plotly figure out, no Streamlit.

Every axis is titled. Heatmaps keep at most ``MAX_CELLS`` cells by showing every s-th position
(exact values, never averages: averaging would blur the fast sinusoids into zero), and say so in
their title. Residuals are drawn on log axes, where exact zeros cannot appear: they are drawn at
``LOG_FLOOR`` and the hover says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from attnviz.figures.common import FOOT_LEGEND

MAX_CELLS = 65536  # about 0.35 MB of float32 per heatmap in the page (shared/FACTS.md)
LOG_FLOOR = 1e-17  # where an exact zero is drawn on a log axis
DIVERGING = "RdBu_r"  # negative blue, 0 white, positive red
COLORS = qualitative.D3
MARGIN = {"l": 10, "r": 10, "t": 60, "b": 10}


def row_stride(n_rows: int, n_cols: int, max_cells: int = MAX_CELLS) -> int:
    """The smallest s such that every s-th of ``n_rows`` rows, times ``n_cols`` columns, fits in ``max_cells``."""
    if n_rows < 1 or n_cols < 1 or max_cells < 1:
        raise ValueError(f"rows, columns and max_cells must be positive, got {n_rows}, {n_cols}, {max_cells}")
    return max(1, math.ceil(n_rows * n_cols / max_cells))


def _stride_note(stride: int) -> str:
    return "" if stride == 1 else f" (every {stride}th position shown)"


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def encoding_heatmap(
    pe: np.ndarray, title: str = "Positional encoding", start: int = 0, max_cells: int = MAX_CELLS
) -> go.Figure:
    """The (N, D) table as a heatmap: positions down, dimensions across, values on a -1..1 diverging scale."""
    pe = np.asarray(pe)
    n, d = pe.shape
    s = row_stride(n, d, max_cells)
    rows = np.arange(0, n, s)
    heatmap = go.Heatmap(
        z=_f32(pe[rows]),
        x=np.arange(d),
        y=start + rows,
        colorscale=DIVERGING,
        zmin=-1.0,
        zmax=1.0,
        colorbar={"title": "PE value"},
        hovertemplate="position %{y}<br>dimension %{x}<br>PE %{z:.4f}<extra></extra>",
    )
    layout = {
        "title": title + _stride_note(s),
        "height": 440,
        "margin": MARGIN,
        "xaxis": {"title": "dimension (column of the table)"},
        "yaxis": {"title": "position", "autorange": "reversed"},
    }
    return go.Figure(data=[heatmap], layout=layout)


def dimension_curves(pe: np.ndarray, dims: Sequence[int], labels: Sequence[str], start: int = 0) -> go.Figure:
    """One line per chosen dimension: its value across positions (the Annotated Transformer's chart)."""
    pe = np.asarray(pe)
    positions = start + np.arange(pe.shape[0])
    traces = [
        go.Scatter(
            x=positions,
            y=_f32(pe[:, dim]),
            mode="lines",
            name=label,
            line={"color": COLORS[j % len(COLORS)]},
            hovertemplate=f"{label}<br>position %{{x}}<br>PE %{{y:.4f}}<extra></extra>",
        )
        for j, (dim, label) in enumerate(zip(dims, labels, strict=True))
    ]
    layout = {
        "title": "Chosen dimensions across positions",
        "height": 380,
        "margin": MARGIN,
        "legend": {"title": "dimension"},
        "xaxis": {"title": "position"},
        "yaxis": {"title": "PE(position, dimension)", "range": [-1.1, 1.1]},
    }
    return go.Figure(data=traces, layout=layout)


def wavelength_chart(wavelengths: np.ndarray, base: float) -> go.Figure:
    """Wavelength of each frequency pair on a log axis: a geometric progression is a straight line."""
    lam = np.asarray(wavelengths, dtype=np.float64)
    traces = [
        go.Scatter(
            x=np.arange(lam.size),
            y=lam,
            mode="lines+markers",
            name="wavelength",
            hovertemplate="pair i = %{x}<br>wavelength %{y:.4g} positions<extra></extra>",
        )
    ]
    ends = [0, max(lam.size - 1, 1)]
    for value, text, dash in ((2 * math.pi, "2π (shortest)", "dot"), (2 * math.pi * base, f"2π·{base:g}", "dash")):
        traces.append(
            go.Scatter(
                x=ends,
                y=[value, value],
                mode="lines",
                name=text,
                line={"color": "grey", "dash": dash, "width": 1},
                hovertemplate=f"{text} = {value:.4g}<extra></extra>",
            )
        )
    layout = {
        "title": "Wavelengths: a geometric progression",  # on one line in half of a 1280-pixel screen
        "height": 380,
        "margin": MARGIN,
        "xaxis": {"title": "frequency pair i (dimensions 2i and 2i+1)"},
        "yaxis": {"title": "wavelength (positions, log scale)", "type": "log"},
    }
    return go.Figure(data=traces, layout=layout)


def similarity_heatmap(
    sim: np.ndarray, title: str, value_title: str = "PE(p)·PE(q)", max_cells: int = MAX_CELLS
) -> go.Figure:
    """The (N, N) similarity of every pair of positions, centred at 0; every s-th position when large."""
    sim = np.asarray(sim)
    n = sim.shape[0]
    s = max(1, math.ceil(n / math.isqrt(max_cells)))
    idx = np.arange(0, n, s)
    heatmap = go.Heatmap(
        z=_f32(sim[np.ix_(idx, idx)]),
        x=idx,
        y=idx,
        colorscale=DIVERGING,
        zmid=0.0,
        colorbar={"title": value_title},
        hovertemplate=f"position p %{{y}}<br>position q %{{x}}<br>{value_title} %{{z:.4f}}<extra></extra>",
    )
    layout = {
        "title": title + _stride_note(s),
        "height": 440,
        "margin": MARGIN,
        "xaxis": {"title": "position q", "scaleanchor": "y", "constrain": "domain"},
        "yaxis": {"title": "position p", "autorange": "reversed", "constrain": "domain"},
    }
    return go.Figure(data=[heatmap], layout=layout)


def offset_profile_chart(
    profile: pd.DataFrame, title: str, value_title: str = "PE(p)·PE(p+k)", closed_form: np.ndarray | None = None
) -> go.Figure:
    """Mean similarity per offset k with the band from min to max over p: a zero-width band = offset only."""
    k = profile["offset"].to_numpy()
    traces = [
        go.Scatter(x=k, y=profile["max"], mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"),
        go.Scatter(
            x=k,
            y=profile["min"],
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor="rgba(31,119,180,0.25)",
            name="min to max over p",
            hoverinfo="skip",
        ),
        go.Scatter(
            x=k,
            y=profile["mean"],
            mode="lines",
            name="mean over p",
            line={"color": COLORS[0]},
            customdata=np.stack([profile["std"], profile["pairs"]], axis=-1),
            hovertemplate="offset %{x}<br>mean %{y:.4f}<br>std %{customdata[0]:.2e} over %{customdata[1]} pairs"
            "<extra></extra>",
        ),
    ]
    if closed_form is not None:
        traces.append(
            go.Scatter(
                x=k,
                y=closed_form,
                mode="lines",
                name="Σ_i cos(k·ω_i)",
                line={"color": COLORS[1], "dash": "dot"},
                hovertemplate="offset %{x}<br>closed form %{y:.4f}<extra></extra>",
            )
        )
    layout = {
        "title": title,
        "height": 380,
        "margin": MARGIN,
        "xaxis": {"title": "offset k = q − p (positions)"},
        "yaxis": {"title": value_title},
    }
    return go.Figure(data=traces, layout=layout)


def layout_comparison(interleaved: np.ndarray, concat: np.ndarray, max_cells: int = MAX_CELLS) -> go.Figure:
    """The interleaved (paper) and concatenated (sin | cos) tables side by side, same colour scale."""
    n, d = np.asarray(interleaved).shape
    s = row_stride(n, d, max_cells // 2)
    rows = np.arange(0, n, s)
    traces = [
        go.Heatmap(
            z=_f32(np.asarray(table)[rows]),
            x=np.arange(d),
            y=rows,
            colorscale=DIVERGING,
            zmin=-1.0,
            zmax=1.0,
            showscale=x_axis == "x2",
            colorbar={"title": "PE value"},
            name=name,
            hovertemplate=f"{name}<br>position %{{y}}<br>dimension %{{x}}<br>PE %{{z:.4f}}<extra></extra>",
            xaxis=x_axis,
            yaxis=y_axis,
        )
        for table, name, x_axis, y_axis in ((interleaved, "interleaved", "x", "y"), (concat, "concat", "x2", "y2"))
    ]
    dimension = {"title": "dimension (column of the table)"}
    layout = {
        "title": "The same numbers in two column orders" + _stride_note(s),
        "height": 440,
        "margin": MARGIN,
        "xaxis": dimension,
        "xaxis2": dimension,
        "yaxis": {"title": "position", "autorange": "reversed"},
        "yaxis2": {"autorange": "reversed"},
    }
    # make_subplots adds the two panels' domains, anchors and titles to this figure in one update.
    return make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=("interleaved (paper): sin, cos, sin, cos, …", "concatenated: all sines | all cosines"),
        figure=go.Figure(data=traces, layout=layout),
    )


def rotation_heatmap(M: np.ndarray, k: int, n_dims: int = 16) -> go.Figure:
    """The top-left ``n_dims`` x ``n_dims`` block of M_k: 2x2 rotations on the diagonal (interleaved)."""
    M = np.asarray(M)
    n = min(n_dims, M.shape[0])
    heatmap = go.Heatmap(
        z=_f32(M[:n, :n]),
        x=np.arange(n),
        y=np.arange(n),
        colorscale=DIVERGING,
        zmin=-1.0,
        zmax=1.0,
        xgap=1,
        ygap=1,
        colorbar={"title": "entry"},
        hovertemplate="output dim %{y}<br>input dim %{x}<br>M_k entry %{z:.6f}<extra></extra>",
    )
    suffix = "" if n == M.shape[0] else f", first {n} of {M.shape[0]} dimensions"
    layout = {
        "title": f"M_k for k = {k}{suffix}",
        "height": 420,
        "margin": MARGIN,
        "xaxis": {"title": "input dimension: PE(pos)", "dtick": 2, "scaleanchor": "y", "constrain": "domain"},
        "yaxis": {"title": "output dimension: PE(pos + k)", "autorange": "reversed", "dtick": 2, "constrain": "domain"},
    }
    return go.Figure(data=[heatmap], layout=layout)


def shift_chart(positions: np.ndarray, predicted: np.ndarray, actual: np.ndarray, k: int, label: str) -> go.Figure:
    """One dimension of M_k·PE(pos) (markers) over the true PE(pos + k) (line), against pos."""
    positions = np.asarray(positions)
    traces = [
        go.Scatter(
            x=positions,
            y=_f32(actual),
            mode="lines",
            name="PE(pos + k)",
            line={"color": COLORS[0]},
            hovertemplate="pos %{x}<br>PE(pos + k) %{y:.6f}<extra></extra>",
        ),
        go.Scatter(
            x=positions,
            y=_f32(predicted),
            mode="markers",
            name="M_k · PE(pos)",
            marker={"color": COLORS[1], "size": 4},
            hovertemplate="pos %{x}<br>M_k·PE(pos) %{y:.6f}<extra></extra>",
        ),
    ]
    layout = {
        "title": f"{label}: M_k·PE(pos) lands on PE(pos + {k})",
        "height": 360,
        "margin": MARGIN,
        "xaxis": {"title": "position pos"},
        "yaxis": {"title": "value in this dimension"},
    }
    return go.Figure(data=traces, layout=layout)


def residual_chart(
    x, series: Mapping[str, np.ndarray], title: str, x_title: str, y_title: str, categorical_x: bool = False
) -> go.Figure:
    """One or more non-negative residual series on a log axis; exact zeros are drawn at ``LOG_FLOOR``.

    ``categorical_x`` spaces the x values evenly as labels (e.g. positions 0, 1,000, 10,000,000).
    """
    traces = []
    for j, (name, values) in enumerate(series.items()):
        values = np.asarray(values, dtype=np.float64)
        traces.append(
            go.Scatter(
                x=np.asarray(x),
                y=np.maximum(values, LOG_FLOOR),
                customdata=values,
                mode="lines+markers" if values.size <= 64 else "lines",
                name=name,
                line={"color": COLORS[j % len(COLORS)]},
                hovertemplate=f"{name}<br>%{{x}}<br>%{{customdata:.3e}}<extra></extra>",
            )
        )
    layout = {
        "title": title,
        "height": 360,
        "margin": MARGIN,
        "xaxis": {"title": x_title, "type": "category" if categorical_x else "-"},
        "yaxis": {"title": f"{y_title} (log scale)", "type": "log", "exponentformat": "power"},
    }
    return go.Figure(data=traces, layout=layout)


def score_by_offset_chart(table, title: str) -> go.Figure:
    """Each head's score (rows of ``table``: head, offset, score) against the offset, one line per head."""
    traces = [
        go.Scatter(
            x=rows["offset"].to_numpy(),
            y=rows["score"].to_numpy(),
            mode="lines",
            name=f"head {head}",
            line={"color": COLORS[j % len(COLORS)]},
            hovertemplate=f"head {head}<br>offset %{{x}}<br>score %{{y:.4f}}<extra></extra>",
        )
        for j, (head, rows) in enumerate(table.groupby("head", sort=True))
    ]
    layout = {
        "title": title,
        "height": 360,
        "margin": MARGIN,
        "xaxis": {"title": "offset: positions from the key to the query"},
        "yaxis": {"title": "scaled score q·k/√d_k"},
    }
    return go.Figure(data=traces, layout=layout)


def angle_addition_chart(pos: np.ndarray, sin_lhs, sin_rhs, cos_lhs, cos_rhs, i: int) -> go.Figure:
    """Both sides of the sine and cosine angle-addition identities for pair i, against pos."""
    pos = np.asarray(pos)
    sides = (
        (sin_lhs, f"PE(pos+k, {2 * i})", "lines", 0),
        (sin_rhs, f"PE(pos,{2 * i})·PE(k,{2 * i + 1}) + PE(pos,{2 * i + 1})·PE(k,{2 * i})", "markers", 0),
        (cos_lhs, f"PE(pos+k, {2 * i + 1})", "lines", 1),
        (cos_rhs, f"PE(pos,{2 * i + 1})·PE(k,{2 * i + 1}) − PE(pos,{2 * i})·PE(k,{2 * i})", "markers", 1),
    )
    traces = [
        go.Scatter(
            x=pos,
            y=_f32(values),
            mode=mode,
            name=name,
            line={"color": COLORS[color]},
            marker={"color": COLORS[color], "size": 4, "symbol": "circle-open"},
            hovertemplate=f"{name}<br>pos %{{x}}<br>%{{y:.6f}}<extra></extra>",
        )
        for values, name, mode, color in sides
    ]
    layout = {
        "title": f"Angle addition for pair i = {i}: lines are the left sides, circles the right sides",
        "height": 400,
        "margin": MARGIN,
        "legend": FOOT_LEGEND,
        "xaxis": {"title": "position pos"},
        "yaxis": {"title": "value", "range": [-1.1, 1.1]},
    }
    return go.Figure(data=traces, layout=layout)
