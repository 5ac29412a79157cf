"""Presenter mode: the app for a room, on a projector (``?present=1``, or the sidebar's toggle).

The sidebar starts collapsed, the main area takes the whole width, body text is at least 20 px
and captions are dark, and every figure is drawn with 18 px tick labels and a 24 px title
(`room`). The mode is a session's, kept across pages in ``st.session_state`` and written to
the address bar as ``present=1``, so that a teacher's link opens the students' view the same way.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from attnviz.app import margins, viewport
from attnviz.app.text import escape_markdown
from attnviz.figures.common import (
    MAX_TICK_CHARS,
    MODEBAR_PX,
    TICK_FONT,
    copied_spec,
    fitted_lines,
    remade,
    rows_that_fit,
    shortened,
    text_px,
)

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
# A chart's title and subtitle outside presenter mode: the sizes Streamlit's plotly theme gives them
# (plotly's subtitle is 0.7 of the title), and plotly's top margin where a figure sets none.
CHART_TITLE_PX, CHART_SUBTITLE_PX, PLOTLY_TOP_MARGIN_PX = 16, 11, 100
# Plotly.js (3.x) draws a title of several lines hung from its top (``yanchor="top"``) higher than the
# same title on one line: by 0.7-1.0 of its font size, measured in chromium at 16 to 24 px (its first
# line loses the CAP_SHIFT that places one line under the anchor); and when the title pushes the top
# margin (``automargin``, as presenter mode's titles do), by about 2.7 font sizes in all, off the figure
# (its drawMainTitle raises every line by LINE_SPACING times the lines added, plus MID_SHIFT): so a
# presenter's title continues in its subtitle (`_title_continued`).
MULTILINE_RISE = 1.0
TITLE_INSET_PX = 8  # a title starts a few px in from the chart's left edge, and should end as far from its right

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


def room(fig: go.Figure, share: float = 1.0) -> go.Figure:
    """``fig`` as this screen shows it, ``share`` the part of the page's width it is drawn in (0.5 in one
    of two columns): outside presenter mode itself, its title broken into lines where it is wider than
    the chart (`fit_title`, with `attnviz.app.viewport.chart_px`) and, on a phone, below plotly's
    toolbar; in presenter mode a copy with room-sized dark text, its title broken likewise
    (`_title_continued`).

    A copy, because the figures pages draw are shared by every session (`attnviz.app.cache.shared`),
    made once for each figure and screen (`_SHOWN`). Every text of the figure is at least `TICK_PX`;
    the title sits right above what the figure shows (the top margin holds the title, and plotly's
    title automargin makes room for key labels and an axis title on top, however they turn); a long
    y-axis title takes two lines, so that a short map does not cut it; and the height is at most
    `PICTURE_MAX_PX`, so that a picture under the title fits a 1280x720 screen.

    The copy is changed as plain dicts and made a figure once: plotly's own updates (update_layout,
    update_xaxes, ...) check every key path anew, and took eight times as long.
    """
    presenting_now, phone = presenting(), viewport.narrow()
    width = viewport.chart_px(share, room=presenting_now) - TITLE_INSET_PX
    key = (id(fig), presenting_now, width, phone)
    made = _SHOWN.get(key)
    if made is not None and made[0]() is fig:
        return fig if made[1] is None else made[1]
    shown = _for_the_room(fig, width) if presenting_now else _fitted(fig, width, phone)
    _SHOWN[key] = (weakref.ref(fig), None if shown is fig else shown, weakref.finalize(fig, _SHOWN.pop, key, None))
    if len(_SHOWN) > SHOWN_KEPT:  # the oldest goes (each step one dict call: sessions run in threads)
        with contextlib.suppress(StopIteration, RuntimeError):
            oldest = _SHOWN.pop(next(iter(_SHOWN)), None)
            if oldest is not None:
                oldest[2].detach()  # its figure may live on: no call left behind for each time it comes back
    return shown


# What `room` made of a figure, by the figure's id, presenter mode or not, the chart's width and phone or
# not (None: the figure as it is). A shared figure (attnviz.app.cache.shared) is drawn by every session on
# every rerun: the room's copy took 2-6 ms to make, a copy with its title broken 2.3 ms, reading whether
# the title fits 0.35 ms. An entry goes with its figure; a copy is as read-only as the figure it came from.
# At most SHOWN_KEPT, the oldest going first: 40 maps of 100 x 100 tokens, each drawn at every width a
# page's script says, in both modes and two shares, kept 256 entries in 46 MiB of peak RSS over the maps
# themselves (without the bound, 10 of them made 720 entries); a few pages on a few screens make ~100.
SHOWN_KEPT = 256
_SHOWN: dict[tuple[int, bool, float, bool], tuple[weakref.ref, go.Figure | None, weakref.finalize]] = {}


def _fitted(fig: go.Figure, width: float, narrow: bool) -> go.Figure:
    """``fig`` outside presenter mode: itself, or a copy with its title broken to ``width`` (`fit_title`),
    on a phone (``narrow``) below plotly's toolbar, and a map's side margins wide enough for its rows and
    colour bar from the first draw (`attnviz.app.margins.settled`)."""
    title = fig.layout.title
    title_px, subtitle_px = title.font.size or CHART_TITLE_PX, title.subtitle.font.size or CHART_SUBTITLE_PX
    fits = _fits(title.text, width, title_px) and _fits(title.subtitle.text, width, subtitle_px)
    phone = narrow and bool(title.text) and (title.pad.t or 0) < MODEBAR_PX
    spec = copied_spec(fig) if any(trace.type == "heatmap" for trace in fig.data) else None
    sides = None if spec is None else margins.settled(*spec)
    if fits and not phone and sides is None:
        return fig
    data, layout = spec or copied_spec(fig)
    if sides is not None:
        layout["margin"] = {**layout.get("margin", {}), **sides}
    if phone:
        _below_toolbar(layout)
    fit_title(layout, width, title_px, subtitle_px)
    return remade(data, layout)


def _for_the_room(fig: go.Figure, width: float) -> go.Figure:
    """``fig``'s copy for presenter mode (`room`), its title broken to ``width``."""
    data, layout = copied_spec(fig)
    font = {"size": TICK_PX, "color": DARK}
    heading = {"size": TEXT_PX, "color": DARK}
    # the whole figure's font: colour bars, legends, hover and every text without a size of its own
    _update(layout, font=font, title={"font": {"size": TITLE_PX, "color": DARK}})
    _update(layout, legend={"font": font, "title": {"font": font}})
    # plotly sizes a subtitle from the figure's own title font, not the room's
    if layout.get("title", {}).get("subtitle", {}).get("text"):
        _update(layout, title={"subtitle": {"font": font}})
    xaxes, yaxes = _axes(layout, "xaxis"), _axes(layout, "yaxis")
    for axis in xaxes + yaxes:
        _update(axis, tickfont=font, title={"font": heading})
    for trace in data:
        if _takes(trace["type"], "textfont"):
            _update(trace, textfont=font)
    for note in layout.get("annotations", []):  # subplot titles (16 px by default) and notes
        _update(note, font=font)
    for trace in data:  # the colour bars drawn (a trace's own, or its markers')
        if _takes(trace["type"], "colorbar") and trace.get("showscale") is not False:
            _update(trace, colorbar={"tickfont": font, "title": {"font": heading}})
        marker = trace.get("marker", {})
        if _takes(trace["type"], "marker.colorbar") and marker.get("showscale"):
            _update(marker, colorbar={"tickfont": font, "title": {"font": heading}})
    for axis in xaxes + yaxes:
        if axis.get("type") == "log":
            # plotly labels a log axis's 2..9 between decades at 0.75 of the font: too small for a room
            axis["minorloglabels"] = "none"
            # and writes a "power" exponent (10 to the -16) at 0.7 of 1.25 times the tick font (plotly.js's
            # formatLog and its <sup> style): the tick font grows so that the exponent is still TICK_PX
            if axis.get("exponentformat") == "power":
                _update(axis, tickfont={"size": math.ceil(TICK_PX / (0.7 * 1.25))})
    for axis in yaxes:
        _two_lines(axis)
    _rows_apart(layout)
    _title_continued(layout, width)
    _title_on_the_plot(layout)
    if layout.get("height") is not None:
        layout["height"] = min(max(layout["height"], MIN_HEIGHT_PX), PICTURE_MAX_PX)
    return remade(data, layout)


def _fits(text: str | None, width: float, font_px: float) -> bool:
    """Whether every line of a title's ``text`` is at most ``width`` px drawn at ``font_px``."""
    return not text or all(text_px(line, font_px) <= width for line in text.split("<br>"))


def fit_title(layout: dict, width: float, title_px: float, subtitle_px: float) -> None:
    """The ``layout``'s title and subtitle broken into lines at most ``width`` px wide (`fitted_lines`),
    drawn at ``title_px`` and ``subtitle_px``. The top margin (and the figure, where it has a height)
    grows by the lines added, so that what was under the title stays clear of it and the plot keeps
    its height.

    Plotly draws a title of more than one line hung from its top (``yanchor="top"``) higher than the
    same title on one line (`MULTILINE_RISE`): a title broken here is moved down by as much.
    """
    title = layout.get("title") or {}
    added = 0.0
    for part, font_px in ((title, title_px), (title.get("subtitle") or {}, subtitle_px)):
        text = part.get("text")
        if not text:
            continue
        part["text"] = fitted_lines(text, width, font_px)
        added += LINE * font_px * (part["text"].count("<br>") - text.count("<br>"))
        if part is title and title.get("yanchor") == "top" and "<br>" in part["text"] and "<br>" not in text:
            shift = round(MULTILINE_RISE * font_px)
            _lowered(title, shift)
            added += shift
    if added:
        _taller_top(layout, round(added))


def _title_continued(layout: dict, width: float) -> None:
    """A presenter's title broken into lines at most ``width`` px wide: its first line stays the title,
    and the lines after it open the subtitle, at the title's size and weight, before the subtitle's
    own lines (broken too). A title of several lines plotly draws off the figure when the title makes
    room for the key labels under it (its automargin, `MULTILINE_RISE`); a subtitle of several lines
    it draws in place. A subtitle of one line it sets a line further down, so the subtitle made here
    always has several: the last is a space where the title had no subtitle."""
    title = layout.get("title") or {}
    if not title.get("text"):
        return
    lines = fitted_lines(title["text"], width, TITLE_PX).split("<br>")
    subtitle = title.get("subtitle") or {}
    own = fitted_lines(subtitle["text"], width, TICK_PX) if subtitle.get("text") else None
    if len(lines) == 1:
        if own:
            subtitle["text"] = own
        return
    title["text"] = lines[0]
    rest = [f"<span style='font-size:{TITLE_PX}px'><b>{line}</b></span>" for line in lines[1:]]
    title["subtitle"] = {**subtitle, "text": "<br>".join([*rest, own or "\u00a0"])}
    _update(title, subtitle={"font": {"size": TICK_PX, "color": DARK}})


def _below_toolbar(layout: dict) -> None:
    """The title of ``layout`` moved down below plotly's toolbar, and the figure's top with it: on a phone
    the toolbar floats over the figure's top right corner, where a long title's first line ends."""
    layout["title"].update(y=1.0, yref="container", yanchor="top")
    _lowered(layout["title"], MODEBAR_PX)
    _taller_top(layout, MODEBAR_PX)


def _lowered(title: dict, px: int) -> None:
    """A title's padding above it ``px`` more."""
    pad = title.get("pad") or {}
    title["pad"] = {**pad, "t": (pad.get("t") or 0) + px}


def _taller_top(layout: dict, px: int) -> None:
    """``px`` more of top margin, and as much more height where the figure has one: the plot keeps its size."""
    margin = layout.setdefault("margin", {})
    margin["t"] = (margin.get("t") if margin.get("t") is not None else PLOTLY_TOP_MARGIN_PX) + px
    if layout.get("height") is not None:
        layout["height"] += px


def _update(spec: dict, **changes) -> None:
    """Set ``changes`` in ``spec`` (a figure's dict, or a part of one) as plotly's ``update`` does: a
    dict merges into the dict already there, key by key; anything else replaces what was there."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            _update(spec[key], **value)
        else:
            spec[key] = _copied(value)


def _copied(value):
    """``value`` with its dicts copied, so that no two places of a figure's dict share one."""
    return {key: _copied(v) for key, v in value.items()} if isinstance(value, dict) else value


def _axes(layout: dict, kind: str) -> list[dict]:
    """The layout's axes of ``kind`` ("xaxis": xaxis, xaxis2, ...); the first is made when there is
    none, as plotly's update_xaxes makes it."""
    names = [key for key in layout if key == kind or (key.startswith(kind) and key[len(kind) :].isdigit())]
    if not names:
        layout[kind] = {}
        names = [kind]
    return [layout[name] for name in names]


@functools.cache
def _takes(trace_type: str, path: str) -> bool:
    """Whether a plotly trace of ``trace_type`` has the property ``path`` ("textfont", "marker.colorbar")."""
    part = go.Figure(data=[{"type": trace_type}]).data[0]
    for name in path.split("."):
        if name not in part:
            return False
        part = part[name]
    return True


def _two_lines(axis: dict) -> None:
    """A y-axis title longer than `LONG_AXIS_TITLE` characters on two lines (after its colon, if it has
    one, else at the space nearest its middle): drawn along a short map, one line would be cut."""
    text = axis.get("title", {}).get("text")
    if not text or len(text) <= LONG_AXIS_TITLE or "<br>" in text:
        return
    if ": " in text:
        at = text.index(": ") + 1
    else:
        spaces = [i for i, c in enumerate(text) if c == " "]
        if not spaces:
            return
        at = min(spaces, key=lambda i: abs(i - len(text) / 2))
    axis["title"]["text"] = text[:at].rstrip() + "<br>" + text[at:].lstrip()


def _rows_apart(layout: dict) -> None:
    """A map's row labels kept apart at the room's size: the labels chosen for the figure's own font and
    height (`attnviz.figures.common.rows_that_fit`) would touch at `TICK_PX` in at most `PICTURE_MAX_PX`,
    so only every n-th of them stays, named by its position as `attnviz.figures.common.ticks` names
    the rows of a thinned axis. Figures with one y axis of listed category ticks only (the maps)."""
    axis = layout.get("yaxis", {})
    if "yaxis2" in layout or axis.get("type") != "category" or axis.get("tickmode") != "array":
        return
    if axis.get("tickvals") is None:
        return
    values, texts = list(axis["tickvals"]), list(axis.get("ticktext") or axis["tickvals"])
    # The rows keep at least what the figure's margins leave them (the title's automargin,
    # `_title_on_the_plot`, gives the room's larger key labels their height back from the title's own
    # band): an estimate on the short side, so each label is given one line of text, not the figure's
    # more generous pitch (tests/test_row_labels.py measures the drawn labels).
    margin = layout.get("margin", {})
    margins = (margin.get("t") or 0) + (margin.get("b") or 0)
    rows_px = min(max(layout.get("height") or PICTURE_MAX_PX, MIN_HEIGHT_PX), PICTURE_MAX_PX) - margins
    fit = rows_that_fit(rows_px, TICK_PX, pitch=ROOM_ROW_PITCH)
    if len(values) <= fit:
        return
    step = math.ceil(len(values) / fit)
    # The ticks show tokens alone (every row labelled): thinned, they show positions too. A token's tick
    # may be cut ("…", `ticks`), which its value, the whole label, is not.
    token_only = all(str(v).endswith(str(t)) or str(t).endswith("…") for v, t in zip(values, texts, strict=True))
    shown = values[::step]
    axis["tickvals"] = shown
    axis["ticktext"] = [shortened(str(v), MAX_TICK_CHARS) for v in shown] if token_only else texts[::step]


def _title_on_the_plot(layout: dict) -> None:
    """The title at the top with no empty band under it.

    Plotly's title automargin stacks key labels and an axis title on top under the title, but only
    when the title pushes the margin, that is when the margin alone is too small for it: so the top
    margin is left small, except over subplot titles (annotations, which push nothing), where it
    holds the title's lines and theirs.
    """
    title = layout.get("title", {})
    if not title.get("text"):
        return
    subtitle = title.get("subtitle", {}).get("text")
    lines = title["text"].count("<br>") + 1 + (subtitle.count("<br>") + 1 if subtitle else 0)
    above = any(
        a.get("yref") in (None, "paper") and a.get("y") is not None and a["y"] >= 1 and a.get("text")
        for a in layout.get("annotations", [])
    )
    top = TITLE_PAD_PX
    if above:
        top += round(LINE * TITLE_PX * lines) + round(LINE * TICK_PX) + 2 * TITLE_PAD_PX
    title_place = {"automargin": True, "yref": "container", "y": 1.0, "yanchor": "top"}
    _update(layout, title={**title_place, "pad": {"t": TITLE_PAD_PX, "b": TITLE_PAD_PX}}, margin={"t": top})
