"""Presenter mode: the app for a room, on a projector (``?present=1``, or the sidebar's toggle).

The sidebar starts collapsed, the main area takes the whole width, body text is at least 20 px
and captions are dark, and every figure is drawn with 18 px tick labels and a 24 px title
(:func:`room`). The mode is a session's, kept across pages in ``st.session_state`` and written to
the address bar as ``present=1``, so that a teacher's link opens the students' view the same way.
"""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

PRESENT = "present"  # the session key and the URL parameter
ON = ("1", "true")
TICK_PX, TEXT_PX, TITLE_PX = 18, 20, 24  # the room's sizes: tick labels, body and axis titles, figure titles
DARK = "#111111"
NORMAL_TICK_PX = 14  # figures.common.TICK_FONT: what the figures' margins were sized for
MIN_HEIGHT_PX = 400  # a one-row map (a decoding step) still shows its colour bar's labels apart

# Streamlit's own elements, sized for the back of the room. Only the app's own text and widgets:
# nothing here depends on what a visitor typed.
ROOM_CSS = f"""
<style>
[data-testid="stMainBlockContainer"] {{ max-width: 100%; padding: 3.5rem 2rem 2rem 2rem; }}
[data-testid="stMain"] [data-testid="stMarkdownContainer"] p,
[data-testid="stMain"] [data-testid="stMarkdownContainer"] li {{ font-size: {TEXT_PX + 2}px; color: {DARK}; }}
[data-testid="stMain"] [data-testid="stCaptionContainer"],
[data-testid="stMain"] [data-testid="stCaptionContainer"] p {{ font-size: {TEXT_PX}px; color: #222222; }}
[data-testid="stMain"] [data-testid="stWidgetLabel"] p {{ font-size: {TEXT_PX}px; color: {DARK}; }}
[data-testid="stMain"] [data-baseweb="select"] *,
[data-testid="stMain"] button p, [data-testid="stMain"] label p {{ font-size: {TEXT_PX}px; }}
[data-testid="stMain"] h1 {{ font-size: 2.4rem; padding-top: 0; }}
</style>
"""


def presenting() -> bool:
    """Whether this session is in presenter mode: its toggle, or, before the toggle is drawn, the link."""
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
    first screen of a projector shows it, the controls below), else the page itself, in order."""
    return st.container() if presenting() else st


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

    A copy, because the figures pages draw are shared by every session (:func:`attnviz.app.cache.shared`).
    The top margin, sized for the key labels above the map, grows with them; the height stays, so
    that a map under the title fits a 1280x720 screen.
    """
    if not presenting():
        return fig
    fig = go.Figure(fig)
    font = {"size": TICK_PX, "color": DARK}
    fig.update_layout(font={"size": TEXT_PX - 4, "color": DARK}, title_font={"size": TITLE_PX, "color": DARK})
    fig.update_xaxes(tickfont=font, title_font={"size": TEXT_PX, "color": DARK})
    fig.update_yaxes(tickfont=font, title_font={"size": TEXT_PX, "color": DARK})
    fig.update_traces(textfont={"size": TICK_PX - 2, "color": DARK}, selector={"type": "scatter"})
    # plotly labels a log axis's 2..9 between decades at 0.75 of the font: too small for a room
    fig.update_xaxes(minorloglabels="none", selector={"type": "log"})
    fig.update_yaxes(minorloglabels="none", selector={"type": "log"})
    top = fig.layout.margin.t
    if top is not None:
        fig.update_layout(margin_t=round(top * TICK_PX / NORMAL_TICK_PX))
    if fig.layout.height is not None and fig.layout.height < MIN_HEIGHT_PX:
        fig.update_layout(height=MIN_HEIGHT_PX)  # a colour bar's 18 px labels need the height
    return fig
