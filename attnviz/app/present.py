"""Presenter mode: the app for a room, on a projector (``?present=1``, or the sidebar's toggle).

The sidebar starts collapsed, the main area takes the whole width, body text is at least 20 px
and captions are dark, and every figure is drawn with 18 px tick labels and a 24 px title
(`room`). The mode is a session's, kept across pages in ``st.session_state`` and written to
the address bar as ``present=1``, so that a teacher's link opens the students' view the same way.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from attnviz.app import viewport
from attnviz.app.text import escape_markdown
from attnviz.figures.common import TICK_FONT, rows_that_fit

PRESENT = "present"  # the session key and the URL parameter
ON = ("1", "true")
TICK_PX, TEXT_PX, TITLE_PX = 18, 20, 24  # the room's sizes: tick labels, body and axis titles, figure titles
DARK = "#111111"
NORMAL_TICK_PX = TICK_FONT["size"]  # what the figures' margins and row labels were sized for
MIN_HEIGHT_PX = 400  # a one-row map (a decoding step) still shows its colour bar's labels apart
# The tallest figure: under the title and a tab bar with its buttons (about 235 px), it fits a
# 1280x720 screen. A 1920x1080 screen shows it whole with room to spare.
PICTURE_MAX_PX = 470
LONG_AXIS_TITLE = 18  # characters: a longer y-axis title goes on two lines
LINE = 1.3  # a line of text takes its font size times this
ROOM_ROW_PITCH = 1.2  # a row label's height in the room, in font sizes (see _rows_apart)
TITLE_PAD_PX = 10

ROOM_TABLE_ROWS = 40  # a longer table stays a scrolling data frame: as a page of HTML it would fill screens
FIRST = "room_first_"  # the key prefix of containers drawn first in their block (`first`)

# Streamlit's own elements, sized for the back of the room. Only the app's own text and widgets:
# nothing here depends on what a visitor typed.
ROOM_CSS = f"""
<style>
[data-testid="stMainBlockContainer"] {{ max-width: 100%; padding: 3.5rem 2rem 2rem 2rem; }}
[data-testid="stMain"] [data-testid="stMarkdownContainer"] p,
[data-testid="stMain"] [data-testid="stMarkdownContainer"] li {{ font-size: {TEXT_PX + 2}px; color: {DARK}; }}
[data-testid="stMain"] [data-testid="stCaptionContainer"] {{ opacity: 1; }}
[data-testid="stMain"] [data-testid="stCaptionContainer"],
[data-testid="stMain"] [data-testid="stCaptionContainer"] p {{ font-size: {TEXT_PX}px; color: #222222; }}
[data-testid="stMain"] [data-testid="stMarkdownContainer"] code,
[data-testid="stMain"] [data-testid="stCaptionContainer"] code {{ font-size: max(0.9em, {TICK_PX}px); }}
[data-testid="stMain"] .katex {{ font-size: 26px; }}
[data-testid="stMain"] [data-testid="stWidgetLabel"] p {{ font-size: {TEXT_PX}px; color: {DARK}; }}
[data-testid="stMain"] input, [data-testid="stMain"] textarea, [data-testid="stMain"] [data-baseweb="tag"] span,
[data-testid="stMain"] [role="tab"] p, [data-testid="stMain"] [role="option"],
[data-testid="stMain"] button p, [data-testid="stMain"] label p {{ font-size: {TEXT_PX}px; }}
[data-testid="stMain"] [data-testid="stMultiSelectTagsContainer"] span {{ font-size: {TEXT_PX}px; }}
[data-testid="stMain"] [data-testid="stTable"] p {{ font-size: {TEXT_PX}px; line-height: {LINE}; }}
[data-testid="stMain"] [data-testid="stTable"] :is(td, th) > div {{ max-width: none; }}
[data-testid="stMain"] [data-testid="stSlider"] [role="group"] {{ padding-top: 0.9rem; }}
[data-testid="stMain"] [data-testid="stSliderThumbValue"] {{ transform: translateY(-0.6rem); }}
[data-testid="stMain"] [data-testid="stSliderThumbValue"] p,
[data-testid="stMain"] [data-testid="stSliderTickBar"] p {{ font-size: {TICK_PX}px; }}
[data-testid="stMain"] h1 {{ font-size: 2.4rem; padding-top: 0; }}
[data-testid="stMain"] [data-testid="stElementContainer"]:has(h1) {{ order: -2; }}
[data-testid="stMain"] [data-testid="stLayoutWrapper"]:has(> [class*="st-key-{FIRST}"]) {{ order: -1; }}
</style>
"""


def presenting() -> bool:
    """Whether this session is in presenter mode: its toggle, or, before the toggle is drawn, the link."""
    if viewport.narrow():  # a phone is no projector: a teacher's link opens in the phone's layout there
        return False
    if PRESENT in st.session_state:
        return bool(st.session_state[PRESENT])
    return st.query_params.get(PRESENT, "").lower() in ON


def page_config(title: str, icon: str = "🔍") -> bool:
    """``st.set_page_config`` for a page (wide; in presenter mode the sidebar collapsed and the room's
    styles); whether the page is presented. Every page calls it first."""
    present = presenting()
    st.set_page_config(
        page_title=f"attnviz: {title}" if title else "attnviz",
        page_icon=icon,
        layout="wide",
        initial_sidebar_state="collapsed" if present else "auto",
    )
    if present:
        st.html(ROOM_CSS)
    return present


def intro(text: str, prose: bool = False) -> None:
    """A page's introduction under its title (a caption, or with ``prose`` a paragraph), left out in
    presenter mode, where the teacher speaks it and the room needs the height for the picture."""
    if not presenting():
        (st.markdown if prose else st.caption)(text)


def picture_area():
    """Where a page's main picture goes: a container right under the title in presenter mode (the
    first screen of a projector shows it, the controls below) and on a phone
    (`attnviz.app.viewport.picture_area`), else the page itself, in order."""
    phone = viewport.picture_area()
    if phone is not None:
        return phone
    return st.container() if presenting() else st


def first(name: str):
    """A container that presenter mode draws first in its block, right under the page's title or its tab
    bar, wherever the page makes it: a tab's or a stage's picture before the text and controls that
    come before it in the page's own order. Elsewhere a plain container, in place."""
    return st.container(key=FIRST + name) if presenting() else st.container()


def data_table(data, container=None, **dataframe) -> None:
    """``data`` as a table to read: in presenter mode, up to `ROOM_TABLE_ROWS` rows, an HTML table whose text
    the room's styles size; elsewhere, or longer, ``st.dataframe(data, **dataframe)``.

    A data frame draws its text on a canvas, at the theme's 14 px, which no page style reaches.
    ``data`` may be a pandas Styler (its frame is ``data.data``).
    """
    where = st if container is None else container
    frame = getattr(data, "data", data)
    if not presenting() or len(frame) > ROOM_TABLE_ROWS:
        where.dataframe(data, **dataframe)
        return
    # st.table reads its cells as markdown: text from outside (a token, a model's output) shows as typed
    texts = [column for column in frame.columns if pd.api.types.is_string_dtype(frame[column])]
    if frame is data:
        data = frame.copy()
        for column in texts:
            data[column] = frame[column].map(escape_markdown)
    elif texts:
        data = data.format(escape_markdown, subset=texts)
    where.table(data, hide_index=dataframe.get("hide_index"))


def folded(label: str):
    """Where a page puts a grid the teacher works in (editing cells, sorting, picking a row): in presenter mode
    a closed expander, ``label``, since the grid's canvas text (14 px) is not for the room to read; elsewhere
    a plain container, in place."""
    return st.expander(label) if presenting() else st.container()


def _sync_url() -> None:
    """The toggle's callback: ``present=1`` in the address bar while presenting, nothing otherwise."""
    if st.session_state.get(PRESENT):
        st.query_params[PRESENT] = "1"
    else:
        st.query_params.pop(PRESENT, None)


def toggle() -> None:
    """The sidebar's presenter-mode toggle, starting from the link's ``present`` parameter."""
    if PRESENT not in st.session_state:
        st.session_state[PRESENT] = presenting()
    st.toggle(
        "Presenter mode",
        key=PRESENT,
        on_change=_sync_url,
        help="For a projector: the sidebar folds away, text and labels grow, figures take the whole width. "
        "The link then carries present=1. Shift+arrows step where a page has steps.",
    )


def room(fig: go.Figure) -> go.Figure:
    """``fig`` as a room sees it: itself outside presenter mode, else a copy with room-sized dark text.

    A copy, because the figures pages draw are shared by every session (`attnviz.app.cache.shared`).
    Every text of the figure is at least `TICK_PX`; the title sits right above what the figure
    shows (the top margin holds the title, and plotly's title automargin makes room for key labels
    and an axis title on top, however they turn); a long y-axis title takes two lines, so that a
    short map does not cut it; and the height is at most `PICTURE_MAX_PX`, so that a picture under
    the title fits a 1280x720 screen.
    """
    if not presenting():
        return fig
    fig = go.Figure(fig)
    font = {"size": TICK_PX, "color": DARK}
    fig.update_layout(
        font=font,  # colour bars, legends, hover and every text without a size of its own
        title_font={"size": TITLE_PX, "color": DARK},
        legend_font=font,
        legend_title_font=font,
    )
    if fig.layout.title.subtitle.text:  # plotly sizes a subtitle from the figure's own title font, not the room's
        fig.update_layout(title_subtitle_font=font)
    fig.update_xaxes(tickfont=font, title_font={"size": TEXT_PX, "color": DARK})
    fig.update_yaxes(tickfont=font, title_font={"size": TEXT_PX, "color": DARK})
    fig.update_traces(textfont=font, selector=lambda trace: "textfont" in trace)
    fig.update_annotations(font=font)  # subplot titles (16 px by default) and notes
    for trace in fig.data:  # the colour bars drawn (a trace's own, or its markers')
        for owner in (trace, getattr(trace, "marker", None)):
            if owner is not None and "colorbar" in owner and owner.showscale is not False:
                if owner is trace or owner.showscale:
                    owner.colorbar.update(tickfont=font, title_font={"size": TEXT_PX, "color": DARK})
    # plotly labels a log axis's 2..9 between decades at 0.75 of the font: too small for a room
    fig.update_xaxes(minorloglabels="none", selector={"type": "log"})
    fig.update_yaxes(minorloglabels="none", selector={"type": "log"})
    # and writes a "power" exponent (10 to the -16) at 0.7 of 1.25 times the tick font (plotly.js's
    # formatLog and its <sup> style): the tick font grows so that the exponent is still TICK_PX
    power = {"type": "log", "exponentformat": "power"}
    fig.update_xaxes(tickfont_size=math.ceil(TICK_PX / (0.7 * 1.25)), selector=power)
    fig.update_yaxes(tickfont_size=math.ceil(TICK_PX / (0.7 * 1.25)), selector=power)
    fig.for_each_yaxis(_two_lines)
    _rows_apart(fig)
    _title_on_the_plot(fig)
    height = fig.layout.height
    if height is not None:
        fig.update_layout(height=min(max(height, MIN_HEIGHT_PX), PICTURE_MAX_PX))
    return fig


def _two_lines(axis) -> None:
    """A y-axis title longer than `LONG_AXIS_TITLE` characters on two lines (after its colon, if it has
    one, else at the space nearest its middle): drawn along a short map, one line would be cut."""
    text = axis.title.text
    if not text or len(text) <= LONG_AXIS_TITLE or "<br>" in text:
        return
    if ": " in text:
        at = text.index(": ") + 1
    else:
        spaces = [i for i, c in enumerate(text) if c == " "]
        if not spaces:
            return
        at = min(spaces, key=lambda i: abs(i - len(text) / 2))
    axis.title.text = text[:at].rstrip() + "<br>" + text[at:].lstrip()


def _rows_apart(fig: go.Figure) -> None:
    """A map's row labels kept apart at the room's size: the labels chosen for the figure's own font and
    height (`attnviz.figures.common.rows_that_fit`) would touch at `TICK_PX` in at most `PICTURE_MAX_PX`,
    so only every n-th of them stays, named by its position as `attnviz.figures.common.ticks` names
    the rows of a thinned axis. Figures with one y axis of listed category ticks only (the maps)."""
    axis = fig.layout.yaxis
    if "yaxis2" in fig.layout or axis.type != "category" or axis.tickmode != "array" or axis.tickvals is None:
        return
    values, texts = list(axis.tickvals), list(axis.ticktext or axis.tickvals)
    # The rows keep at least what the figure's margins leave them (the title's automargin,
    # `_title_on_the_plot`, gives the room's larger key labels their height back from the title's own
    # band): an estimate on the short side, so each label is given one line of text, not the figure's
    # more generous pitch (tests/test_row_labels.py measures the drawn labels).
    margins = (fig.layout.margin.t or 0) + (fig.layout.margin.b or 0)
    rows_px = min(max(fig.layout.height or PICTURE_MAX_PX, MIN_HEIGHT_PX), PICTURE_MAX_PX) - margins
    fit = rows_that_fit(rows_px, TICK_PX, pitch=ROOM_ROW_PITCH)
    if len(values) <= fit:
        return
    step = math.ceil(len(values) / fit)
    token_only = all(str(v).endswith(str(t)) for v, t in zip(values, texts, strict=True))
    shown = values[::step]
    axis.update(tickvals=shown, ticktext=shown if token_only else texts[::step])


def _title_on_the_plot(fig: go.Figure) -> None:
    """The title at the top with no empty band under it.

    Plotly's title automargin stacks key labels and an axis title on top under the title, but only
    when the title pushes the margin, that is when the margin alone is too small for it: so the top
    margin is left small, except over subplot titles (annotations, which push nothing), where it
    holds the title's lines and theirs.
    """
    title = fig.layout.title
    if not title.text:
        return
    lines = title.text.count("<br>") + 1 + (1 if title.subtitle.text else 0)
    above = any(a.yref in (None, "paper") and a.y is not None and a.y >= 1 and a.text for a in fig.layout.annotations)
    top = TITLE_PAD_PX
    if above:
        top += round(LINE * TITLE_PX * lines) + round(LINE * TICK_PX) + 2 * TITLE_PAD_PX
    fig.update_layout(
        title={
            "automargin": True,
            "yref": "container",
            "y": 1.0,
            "yanchor": "top",
            "pad": {"t": TITLE_PAD_PX, "b": TITLE_PAD_PX},
        },
        margin_t=top,
    )
