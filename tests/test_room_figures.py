"""Presenter mode's restyling of a figure (`attnviz.app.present.room`), against plotly's own updates.

`room` edits a copy of the figure's dict and makes the figure once, because plotly's update methods
took 20-50 ms a figure on every rerun of a presenter's page. The reference here does the same
restyling with those methods (update_layout, update_xaxes, update_traces, ...), which apply plotly's
own rules: which traces take a text font or a colour bar, how a change merges into what is there,
which axes a figure has. The two must make the same figure for every kind of figure the pages draw.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from attnviz.app import present, viewport
from attnviz.app.present import DARK, LINE, LONG_AXIS_TITLE, MIN_HEIGHT_PX, PICTURE_MAX_PX, TITLE_PAD_PX
from attnviz.figures.common import TICK_FONT, fitted_lines, rows_that_fit


def room_by_plotly(fig: go.Figure) -> go.Figure:
    """The room's figure made with plotly's update methods, step by step as `present.room` describes it."""
    fig = go.Figure(fig)
    font = {"size": present.TICK_PX, "color": DARK}
    heading = {"size": present.TEXT_PX, "color": DARK}
    fig.update_layout(font=font, title_font={"size": present.TITLE_PX, "color": DARK})
    fig.update_layout(legend_font=font, legend_title_font=font)
    if fig.layout.title.subtitle.text:
        fig.update_layout(title_subtitle_font=font)
    fig.update_xaxes(tickfont=font, title_font=heading)
    fig.update_yaxes(tickfont=font, title_font=heading)
    fig.update_traces(textfont=font, selector=lambda trace: "textfont" in trace)
    fig.update_annotations(font=font)
    for trace in fig.data:
        for owner in (trace, getattr(trace, "marker", None)):
            if owner is not None and "colorbar" in owner and owner.showscale is not False:
                if owner is trace or owner.showscale:
                    owner.colorbar.update(tickfont=font, title_font=heading)
    fig.update_xaxes(minorloglabels="none", selector={"type": "log"})
    fig.update_yaxes(minorloglabels="none", selector={"type": "log"})
    power = {"type": "log", "exponentformat": "power"}
    fig.update_xaxes(tickfont_size=math.ceil(present.TICK_PX / (0.7 * 1.25)), selector=power)
    fig.update_yaxes(tickfont_size=math.ceil(present.TICK_PX / (0.7 * 1.25)), selector=power)

    def two_lines(axis):
        text = axis.title.text
        if not text or len(text) <= LONG_AXIS_TITLE or "<br>" in text:
            return
        spaces = [i for i, c in enumerate(text) if c == " "]
        if ": " in text:
            at = text.index(": ") + 1
        elif spaces:
            at = min(spaces, key=lambda i: abs(i - len(text) / 2))
        else:
            return
        axis.title.text = text[:at].rstrip() + "<br>" + text[at:].lstrip()

    fig.for_each_yaxis(two_lines)
    axis = fig.layout.yaxis
    if "yaxis2" not in fig.layout and axis.type == "category" and axis.tickmode == "array" and axis.tickvals:
        values, texts = list(axis.tickvals), list(axis.ticktext or axis.tickvals)
        margins = (fig.layout.margin.t or 0) + (fig.layout.margin.b or 0)
        rows_px = min(max(fig.layout.height or PICTURE_MAX_PX, MIN_HEIGHT_PX), PICTURE_MAX_PX) - margins
        fit = rows_that_fit(rows_px, present.TICK_PX, pitch=present.ROOM_ROW_PITCH)
        if len(values) > fit:
            step = math.ceil(len(values) / fit)
            token_only = all(str(v).endswith(str(t)) for v, t in zip(values, texts, strict=True))
            axis.update(tickvals=values[::step], ticktext=values[::step] if token_only else texts[::step])
    width = viewport.chart_px(1.0, room=True) - present.TITLE_INSET_PX  # a 1280-pixel screen's, in the tests
    if fig.layout.title.text:  # a title too wide: its first line, the rest opening the subtitle at its size
        lines = fitted_lines(fig.layout.title.text, width, present.TITLE_PX).split("<br>")
        own = fig.layout.title.subtitle.text
        own = fitted_lines(own, width, present.TICK_PX) if own else None
        if len(lines) > 1:
            rest = [f"<span style='font-size:{present.TITLE_PX}px'><b>{line}</b></span>" for line in lines[1:]]
            fig.update_layout(title_text=lines[0], title_subtitle_text="<br>".join([*rest, own or "\u00a0"]))
            fig.update_layout(title_subtitle_font=font)
        elif own:
            fig.update_layout(title_subtitle_text=own)
    title = fig.layout.title
    if title.text:
        subtitle = title.subtitle.text
        lines = title.text.count("<br>") + 1 + (subtitle.count("<br>") + 1 if subtitle else 0)
        notes = fig.layout.annotations
        above = any(a.yref in (None, "paper") and a.y is not None and a.y >= 1 and a.text for a in notes)
        top = TITLE_PAD_PX
        if above:
            top += round(LINE * present.TITLE_PX * lines) + round(LINE * present.TICK_PX) + 2 * TITLE_PAD_PX
        pad = {"t": TITLE_PAD_PX, "b": TITLE_PAD_PX}
        fig.update_layout(
            title={"automargin": True, "yref": "container", "y": 1.0, "yanchor": "top", "pad": pad}, margin_t=top
        )
    if fig.layout.height is not None:
        fig.update_layout(height=min(max(fig.layout.height, MIN_HEIGHT_PX), PICTURE_MAX_PX))
    return fig


def props(fig: go.Figure) -> tuple[list[dict], dict]:
    """What a figure holds: its traces' and layout's properties as set, numpy arrays as arrays (``to_dict``
    writes them as base64 text, and would not tell an array from that text, which code reading the
    figure's ``z`` or ``customdata`` afterwards cannot use)."""
    return [trace.to_plotly_json() for trace in fig.data], fig.layout.to_plotly_json()


def equal(a, b) -> bool:
    """Deep equality of two figures' properties, numpy arrays by value and dtype."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return type(a) is type(b) and a == b


def subplots_with_log_axes() -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "scores"))
    fig.add_trace(go.Scatter(x=[1, 2], y=[1, 10], marker={"color": [1, 2], "showscale": True}), row=1, col=1)
    fig.add_trace(go.Bar(x=[1, 2], y=[3, 4], text=["a", "b"]), row=1, col=2)
    fig.update_yaxes(type="log", exponentformat="power", row=1, col=1)
    fig.update_xaxes(type="log", row=1, col=2)
    return fig.update_layout(title={"text": "Two<br>lines", "subtitle": {"text": "and a subtitle"}}, height=900)


def tall_map(ticktext: bool) -> go.Figure:
    labels = [f"{i} tok{i}" for i in range(200)]
    axis = {"type": "category", "tickmode": "array", "tickvals": labels, "title": {"text": "query: a long title"}}
    if ticktext:
        axis["ticktext"] = [f"tok{i}" for i in range(200)]
    heatmap = go.Heatmap(z=np.arange(1000.0).reshape(200, 5), y=labels, showscale=ticktext)
    return go.Figure(heatmap, layout={"yaxis": axis, "margin": {"t": 100, "b": 10}, "height": 1200, "title": "Map"})


LONG = " ".join(["in each map, rows: query: decoder input token; columns: key: source token"] * 3)
FIGURES = {
    "subplots with log axes, a marker colour bar, bar text": subplots_with_log_axes,
    "a table, no axes": lambda: go.Figure(go.Table(header={"values": ["a"]}, cells={"values": [[1]]}), layout={}),
    "a tall map, its rows thinned, labels by position": lambda: tall_map(ticktext=False),
    "a tall map, its rows thinned, labels by token": lambda: tall_map(ticktext=True),
    "notes above the plot, a legend title, a hidden marker scale": lambda: go.Figure(
        go.Scatter(x=[1], y=[1], marker={"color": [1], "showscale": False}, textfont={"size": 3, "family": "serif"}),
        layout={
            "annotations": [{"x": 0, "y": 1.2, "text": "above", "yref": "paper"}, {"x": 0, "y": 0.5, "text": "in"}],
            "title": "With notes",
            "legend": {"title": {"text": "heads"}},
            "yaxis": {"title": "averylongtitlewithnospaceatall"},
        },
    ),
    "an empty figure": go.Figure,
    "a title wider than the room's screen, notes above": lambda: go.Figure(
        go.Bar(x=[1], y=[2]),
        layout={
            "title": {"text": " ".join(["max_d |M_k·PE(pos) − PE(pos + k)|"] * 4), "subtitle": {"text": LONG}},
            "annotations": [{"x": 0, "y": 1.1, "text": "above", "yref": "paper"}],
        },
    ),
    "a title wider than the room's screen": lambda: go.Figure(layout={"title": " ".join(["Residual max_d"] * 12)}),
    "a 2-D histogram's own colour bar": lambda: go.Figure(go.Histogram2d(x=[1, 2], y=[1, 2], showscale=True)),
    "a heatmap without a scale": lambda: go.Figure(
        go.Heatmap(z=[[1, 2]], showscale=False, colorbar={"title": {"text": "w"}}),
        layout={"title": "t", "height": 100, "xaxis": {"tickfont": TICK_FONT}},
    ),
}


@pytest.mark.parametrize("make", FIGURES.values(), ids=FIGURES)
def test_the_room_s_figure_is_what_plotly_s_own_updates_make(make, monkeypatch):
    monkeypatch.setattr(present, "presenting", lambda: True)
    fig = make()
    before = props(fig)
    assert equal(props(present.room(fig)), props(room_by_plotly(fig)))
    assert equal(props(fig), before), "the shared figure itself is left as it was"


def test_the_room_s_figures_of_the_pages_are_what_plotly_s_own_updates_make(monkeypatch):
    """The figures the pages draw most: a map of each kind, a long map thinned, a grid, lines, bars."""
    from attnviz.figures import attention, decoding, formation, images, positional

    monkeypatch.setattr(present, "presenting", lambda: True)
    rng = np.random.default_rng(0)
    weights = rng.random((40, 30)).astype(np.float32)
    weights /= weights.sum(axis=1, keepdims=True)
    tokens = [f"▁t{i}" for i in range(40)]
    figures = [
        attention.attention_heatmap(weights, tokens, tokens[:30], "cross"),
        attention.attention_heatmap(weights[:, :30], tokens, tokens[:30], "decoder", contrast="log"),
        attention.lines_view(weights[None, :8, :8], tokens[:8], tokens[:8], [2], "encoder"),
        images.head_grid(np.tile(weights[:8, :8], (2, 3, 1, 1)), tokens[:8], tokens[:8], "encoder", selected=(1, 2)),
        decoding.topk_bar(tokens[:5], [0.5, 0.2, 0.1, 0.1, 0.1], chosen=tokens[1]),
        formation.phase_change_figure([0, 10, 20], [3, 2, 1], [0, 0.5, 1], [0, 0.2, 0.9], (5, 15), (1, 2), (2, 1)),
        positional.residual_chart([1, 2, 3], {"a": [1e-3, 1e-9, 1e-16]}, "Residuals", "k", "residual"),
    ]
    for fig in figures:
        assert equal(props(present.room(fig)), props(room_by_plotly(fig))), fig.layout.title.text


def test_a_presenter_s_map_pointed_at_and_clickable_is_what_plotly_s_own_updates_make(monkeypatch):
    """A presenter's map (`attnviz.app.follow.map_chart`): the pointed cell framed, restyled for the room,
    then an invisible point on every cell, each step a copy made in one go."""
    from attnviz.app import follow
    from attnviz.figures.attention import attention_heatmap

    monkeypatch.setattr(present, "presenting", lambda: True)
    rng = np.random.default_rng(1)
    weights = rng.random((6, 5)).astype(np.float32)
    fig = attention_heatmap(weights / weights.sum(1, keepdims=True), list("abcdef"), list("vwxyz"), "cross")
    x, y = fig.data[0].x[3], fig.data[0].y[4]
    monkeypatch.setattr(follow.st, "session_state", {follow.POINT: {"chart": "map", "x": x, "y": y}})
    frame = {"type": "rect", "x0": 2.5, "x1": 3.5, "y0": 3.5, "y1": 4.5, "name": "pointed"}
    framed = go.Figure(fig).add_shape(line={"color": follow.MARK_COLOUR, "width": 4}, **frame)
    assert equal(props(follow.marked(fig, "map")), props(framed))
    shown = present.room(follow.marked(fig, "map"))
    clickable = follow.clickable(shown)
    cells = clickable.data[-1]
    assert isinstance(clickable.data[0].z, np.ndarray) and len(cells.x) == 6 * 5
    reference = go.Figure(room_by_plotly(framed)).add_trace(cells)
    reference.update_layout(hoverdistance=-1, clickmode="event+select")
    assert equal(props(clickable), props(reference))
