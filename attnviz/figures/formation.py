"""How attention forms: a training history's curves over the steps, with the step shown marked.

Three line charts over the records of a history (`attnviz.lessons.formation`): the losses; every
head's chosen statistic, one line per head, the chosen head drawn over the others; and a language
model's phase change (Olsson et al., 2022), the loss beside the previous-token and induction scores,
the loss's drop shaded. Every point of a head's line carries the head's name (``customdata``), so a
click on a line can pick that head (``st.plotly_chart(on_select=...)``). The maps at a record are
drawn by `attnviz.figures.attention` and `attnviz.figures.images`, as on every page.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import FOOT_LEGEND, HIGHLIGHT, TICK_FONT, vertical_line
from attnviz.kinds import TITLES

STEP_AXIS = "training step"
MARK = {"color": "#333333", "width": 2, "dash": "dash"}  # the step shown
DROP_FILL = "rgba(255, 193, 7, 0.25)"  # the loss's drop: amber, under the lines
DROP = {"fillcolor": DROP_FILL, "line": {"width": 0}, "layer": "below"}
# A head's line takes its site's colour; the chosen head is drawn last, thick and red.
SITE_COLORS = {"encoder": "#1f77b4", "decoder": "#2ca02c", "cross": "#9467bd"}
LINE_OPACITY = 0.55
CHART_HEIGHT = 380  # with a legend of one entry; each further entry adds a row (LEGEND_ROW_PX)
# The legend stands above the plot, one entry a row. Rows that wrap with the width (a horizontal
# legend) change in number when the page is resized, and plotly.js (3.x, Streamlit's bundle) then
# left the legend where the old count had put it, over the plot's top by a row (36 px at the room's
# size, on a page first drawn narrower than it ends up; tests/test_browser_formation.py narrows and
# widens the page to check). A row at the figures' own 12 px text: 116 px for four, in chromium.
LEGEND_ROW_PX = 29
TITLE_PAD = {"t": 10, "b": 10}
MARGIN = {"l": 60, "r": 20, "t": 60, "b": 50}


def _check_steps(steps: Sequence[int], *series: tuple[str, Sequence[float]]) -> np.ndarray:
    steps = np.asarray(steps)
    if steps.ndim != 1 or steps.size == 0:
        raise ValueError(f"steps must be a non-empty 1-D sequence, got shape {steps.shape}")
    for name, values in series:
        if np.shape(values)[-1] != steps.size:
            raise ValueError(f"{name} has {np.shape(values)[-1]} values for {steps.size} steps")
    return steps


def _marks(step: int | None, drop: tuple[int, int] | None = None) -> dict:
    """The layout's shapes and notes: a dashed vertical line at ``step`` (the step shown), labelled with
    it, and the loss's ``drop`` shaded, under the lines (what plotly's add_vline and add_vrect write)."""
    where = {"xref": "x", "y0": 0, "y1": 1, "yref": "y domain"}
    shapes, notes = [], []
    if drop is not None:
        shapes.append({"type": "rect", "x0": drop[0], "x1": drop[1], **where, **DROP})
    if step is not None:
        line, note = vertical_line(step, f"step {step}", MARK)
        shapes.append(line)
        notes.append(note)
    return {"shapes": shapes, "annotations": notes}


def _layout(traces: list, title: str, y_title: str, step: int | None, drop: tuple[int, int] | None = None) -> dict:
    """A chart's layout, the step marked and the drop shaded, made whole (`attnviz.figures`)."""
    entries = sum(trace.showlegend is not False for trace in traces) if len(traces) > 1 else 0
    axis = {"tickfont": TICK_FONT, "gridcolor": "#e6e6e6", "zeroline": False}
    return {
        **_marks(step, drop),
        # the title at the top, and the legend under it: the title's automargin stacks the legend below
        # it, where a fixed top margin let a legend of a few rows climb over the title
        "title": {"text": title, "automargin": True, "yref": "container", "y": 1.0, "yanchor": "top", "pad": TITLE_PAD},
        "height": CHART_HEIGHT + LEGEND_ROW_PX * max(entries - 1, 0),  # the plot keeps its height
        "margin": {**MARGIN, "t": TITLE_PAD["t"]},
        "plot_bgcolor": "white",
        "hovermode": "closest",
        "legend": {"orientation": "v", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
        "xaxis": {"title": {"text": STEP_AXIS}, **axis},
        "yaxis": {"title": {"text": y_title}, **axis},
    }


def loss_curves(
    steps: Sequence[int],
    train_loss: Sequence[float],
    heldout_loss: Sequence[float] | None,
    step: int | None = None,
    drop: tuple[int, int] | None = None,
) -> go.Figure:
    """The train and held-out loss over the records, the step shown marked and, when given, the loss's drop shaded."""
    series = [("train loss", train_loss)] + ([] if heldout_loss is None else [("held-out loss", heldout_loss)])
    steps = _check_steps(steps, *series)
    traces = []
    for (name, values), colour in zip(series, ("#1f77b4", "#ff7f0e"), strict=False):
        values = np.asarray(values, dtype=np.float64)
        if np.all(np.isnan(values)):
            continue
        traces.append(
            go.Scatter(
                x=steps,
                y=values,
                name=name,
                mode="lines+markers",
                marker={"size": 5},
                line={"color": colour, "width": 2},
                hovertemplate=f"step %{{x}}<br>{name} %{{y:.4f}}<extra></extra>",
            )
        )
    return go.Figure(data=traces, layout=_layout(traces, "Loss over training", "loss (nats per token)", step, drop))


def statistic_lines(
    steps: Sequence[int],
    values: np.ndarray,
    heads: Sequence[tuple[str, int, int]],
    ids: Sequence[str],
    statistic: str,
    step: int | None = None,
    selected: str | None = None,
) -> go.Figure:
    """One line per head: ``values`` (n_heads, N) of ``statistic`` over the records; the head ``selected`` (its id)
    red, on top and with its records marked, the step shown marked. Each point's ``customdata`` is its head's id: a
    click picks the head."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != len(heads) or len(ids) != len(heads):
        raise ValueError(f"values must be (heads, steps) for {len(heads)} heads, got {values.shape}")
    steps = _check_steps(steps, ("values", values))
    traces = []
    shown_sites = set()
    order = sorted(range(len(heads)), key=lambda i: ids[i] == selected)  # the chosen head last: drawn on top
    for i in order:
        kind, layer, head = heads[i]
        chosen = ids[i] == selected
        name = f"{TITLES[kind]}, layer {layer}, head {head}"
        traces.append(
            go.Scatter(
                x=steps,
                y=values[i],
                name=name if chosen else TITLES[kind],
                legendgroup="chosen" if chosen else kind,
                showlegend=chosen or kind not in shown_sites,
                mode="lines+markers",
                line={
                    "color": HIGHLIGHT if chosen else SITE_COLORS.get(kind, "#7f7f7f"),
                    "width": 4 if chosen else 1.5,
                },
                # the chosen head's records marked, the others' not drawn: markers on every line were most of the
                # chart's drawing, at every record Play shows (36 lines of 50 records: 60-69 ms a draw in chromium
                # against 25-30, Xeon). They stay in the trace, one drawn and that one unseen: a click selects a
                # point only of a trace with markers, and a click on a line is how its head is picked
                marker={"size": 7} if chosen else {"size": 6, "maxdisplayed": 1, "opacity": 0},
                opacity=1.0 if chosen else LINE_OPACITY,
                customdata=[ids[i]] * steps.size,
                hovertemplate=f"{name}<br>step %{{x}}: {statistic} %{{y:.3f}}<br>click to pick it<extra></extra>",
            )
        )
        shown_sites.add(kind)
    layout = _layout(traces, f"Every head's {statistic} over training", statistic, step)
    return go.Figure(data=traces, layout={**layout, "dragmode": False, "clickmode": "event+select"})


def phase_change_figure(
    steps: Sequence[int],
    loss: Sequence[float],
    previous: Sequence[float],
    induction: Sequence[float],
    drop: tuple[int, int],
    previous_head: tuple[int, int],
    induction_head: tuple[int, int],
    loss_name: str = "held-out loss",
    step: int | None = None,
) -> go.Figure:
    """The phase change on one step axis: the loss (left axis), the previous-token score of the previous-token head
    and the induction score of the induction head (right axis, 0 to 1), the loss's drop shaded."""
    steps = _check_steps(steps, ("loss", loss), ("previous", previous), ("induction", induction))
    # one plot, the scores on a second y axis over the first (what make_subplots' secondary_y lays out)
    traces = [
        go.Scatter(
            x=steps, y=np.asarray(loss, dtype=np.float64), name=loss_name, mode="lines+markers",
            line={"color": "#333333", "width": 2}, marker={"size": 5},
            hovertemplate=f"step %{{x}}<br>{loss_name} %{{y:.4f}}<extra></extra>", xaxis="x", yaxis="y",
        )
    ]  # fmt: skip
    for values, (layer, head), what, colour in (
        (previous, previous_head, "previous-token score", "#1f77b4"),
        (induction, induction_head, "induction score", HIGHLIGHT),
    ):
        name = f"{what}, layer {layer} head {head}"
        traces.append(
            go.Scatter(
                x=steps, y=np.asarray(values, dtype=np.float64), name=name, mode="lines+markers",
                line={"color": colour, "width": 3}, marker={"size": 6},
                hovertemplate=f"step %{{x}}<br>{name} %{{y:.3f}}<extra></extra>", xaxis="x", yaxis="y2",
            )
        )  # fmt: skip
    title = f"The phase change: the loss drops (shaded, steps {drop[0]}-{drop[1]})"
    layout = _layout(traces, title, loss_name, step, drop)
    axis = {key: value for key, value in layout["yaxis"].items() if key != "title"}
    layout["xaxis"] |= {"anchor": "y", "domain": [0.0, 0.94]}
    layout["yaxis"] |= {"anchor": "x", "domain": [0.0, 1.0]}
    layout["yaxis2"] = {"anchor": "x", "overlaying": "y", "side": "right", "title": {"text": "score"}, **axis}
    layout["yaxis2"] |= {"range": [0, 1.02], "showgrid": False}
    layout["legend"] |= FOOT_LEGEND  # under the axis title, not on it
    layout |= {"margin": {**MARGIN, "r": 60}, "height": CHART_HEIGHT + 60}
    return go.Figure(data=traces, layout=layout)
