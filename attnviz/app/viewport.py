"""Phones and small windows: how wide the visitor's screen is, and the page's order on a narrow one.

The server builds every figure and never sees the screen, and Streamlit 1.67's ``st.context``
says nothing of its size. So a small script in the page (`watch`, an ``st.components.v2``
component with no visible content, drawn at the end of every page) tells the server two things
when they differ from what it last drew for: whether the window is under `NARROW_PX`, and how
wide the page's main area is (`main_px`, in steps of `WIDTH_STEP_PX`), unless it is at least as
wide as a 1280-pixel screen gives it (`WIDEST_PX` beside the sidebar, `ROOM_WIDEST_PX` in presenter
mode, where the sidebar is folded), which is what the server assumes until told otherwise: so a
wide screen's first run is its only one. One more run then
draws the page for that screen. It tells again when the window crosses the line (a phone turned
sideways) or the main area changes (a resized window, the sidebar folded).

On a narrow screen a page's main picture comes right after the title (`picture_slot`), the
figures take their narrow layout (``narrow=True`` of `attnviz.figures.attention.attention_heatmap`),
with room above the title for plotly's toolbar. At `NARROW_PX` and wider nothing changes. On
any screen a chart's title is broken into lines that fit the chart (`chart_px`,
`attnviz.app.present.room`): plotly draws a title on one line and cuts it at the chart's edge.
"""

from __future__ import annotations

import streamlit as st

NARROW_PX = 640  # a window narrower than this (a phone, upright or sideways) gets the narrow layout
NARROW = "_narrow"  # session key: whether the browser said its window is narrow (absent: not yet, drawn wide)
WIDTH = "_width"  # session key: the main area's width the browser said (absent: at least the widest)
# The main area of a 1280x720 screen: 820 px beside the sidebar, 1120 px in presenter mode (the sidebar
# folded). Wider counts as this wide: every chart's title is broken for this width.
WIDEST_PX, ROOM_WIDEST_PX = 800, 1100
WIDTH_STEP_PX = 50  # the width is said in steps of this (rounded down): a few more runs as a window is dragged
COLUMN_GAP_PX = 16  # between two of Streamlit's columns (its default gap, 1rem)
SLOT = "_picture_slot"  # session key: this run's place for the main picture, right under the title
WATCH_KEY = "_viewport"  # the component's key ("_": not a choice the pages carry across, see session.keep_state)

# The browser's side: report the screen ({narrow, width}: the window under NARROW_PX, the main
# area's width in steps, null from data.widest up) whenever it differs from what the server was last
# asked to draw for: now, when the window crosses NARROW_PX, and when the main area's width settles
# after a change (a resize, the sidebar folding: many widths in a row, one report). While the page
# shows what this run drew for (``data``), <html data-attnviz-drawn="narrow" or "wide"> says so;
# from the first change of the main area's width until a run has drawn for the new screen it is
# absent (what a browser test waits for).
_JS = """
export default function ({ data, setStateValue }) {
    const root = document.documentElement;
    const query = window.matchMedia(`(max-width: ${data.below - 0.02}px)`);
    const main = document.querySelector("[data-testid='stMainBlockContainer']");
    const width = () => {
        if (!main) return data.width;
        const style = getComputedStyle(main);
        const px = main.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        return px >= data.widest ? null : Math.floor(px / data.step) * data.step;
    };
    const screen = () => ({ narrow: query.matches, width: width() });
    const same = (a, b) => a.narrow === b.narrow && a.width === b.width;
    const served = { narrow: data.narrow, width: data.width };
    let asked = served;
    const report = () => {
        const now = screen();
        if (same(now, served)) {
            root.dataset.attnvizDrawn = data.narrow ? "narrow" : "wide";
        } else {
            delete root.dataset.attnvizDrawn;
        }
        if (!same(now, asked)) {
            asked = now;
            setStateValue("screen", now);
        }
    };
    report();
    query.addEventListener("change", report);
    let timer = null;
    const observer = new ResizeObserver(() => {
        if (!same(screen(), served)) delete root.dataset.attnvizDrawn;
        clearTimeout(timer);
        timer = setTimeout(report, 150);
    });
    if (main) observer.observe(main);
    return () => {
        query.removeEventListener("change", report);
        observer.disconnect();
        clearTimeout(timer);
    };
}
"""
_watcher = st.components.v2.component("attnviz.viewport", js=_JS)
# The component shows nothing, but its place in the page would add a gap under the footer: out of the layout.
_HIDDEN = f"<style>.st-key-{WATCH_KEY} {{ display: none; }}</style>"


def narrow() -> bool:
    """Whether this session's browser said that its window is narrower than `NARROW_PX`."""
    return bool(st.session_state.get(NARROW, False))


def widest(room: bool = False) -> int:
    """The main area's width the server assumes until the browser says it is narrower: `ROOM_WIDEST_PX`
    in presenter mode (``room``), else `WIDEST_PX`."""
    return ROOM_WIDEST_PX if room else WIDEST_PX


def main_px(room: bool = False) -> int:
    """The width of the page's main area that this session's browser said, at most `widest`."""
    said = st.session_state.get(WIDTH)
    return widest(room) if said is None else min(said, widest(room))


def chart_px(share: float = 1.0, room: bool = False) -> float:
    """About how wide a chart is drawn that takes ``share`` of the main area (a column's weight: 0.5 for
    one of two columns, 0.4 for the first of ``st.columns([2, 3])``), in presenter mode with ``room``.
    On a narrow screen Streamlit stacks columns, each the whole width."""
    if narrow():
        share = 1.0
    return main_px(room) * share - COLUMN_GAP_PX * (1 - share)


def _reported() -> None:
    """The component's callback: keep what the browser said, for the runs and pages that follow."""
    screen = (st.session_state.get(WATCH_KEY) or {}).get("screen") or {}
    st.session_state[NARROW] = bool(screen.get("narrow"))
    width = screen.get("width")
    # null: at least the widest; else a width a page could have, in steps (anything else, what a script
    # sent, is not kept: present.room keeps a copy of a figure for each width, so there are few widths)
    if width is None:
        st.session_state.pop(WIDTH, None)
    elif (
        isinstance(width, int)
        and not isinstance(width, bool)
        and 2 * WIDTH_STEP_PX <= width < ROOM_WIDEST_PX
        and width % WIDTH_STEP_PX == 0
    ):
        st.session_state[WIDTH] = width


def watch(room: bool = False) -> None:
    """Ask the browser about its screen (see the module's text), ``room`` in presenter mode. The frame calls
    it at the page's end: the component is out of the layout, and the page's own elements keep their places."""
    st.html(_HIDDEN)  # style alone: Streamlit puts it where it takes no space
    width = st.session_state.get(WIDTH)
    data = {"below": NARROW_PX, "narrow": narrow(), "width": width, "widest": widest(room), "step": WIDTH_STEP_PX}
    _watcher(key=WATCH_KEY, data=data, on_screen_change=_reported)


def picture_slot() -> None:
    """On a narrow screen, keep a place for the page's main picture right under the title, before the
    page's introduction (`picture_area` gives it to the page). The frame calls it after the title."""
    st.session_state[SLOT] = st.container() if narrow() else None


def picture_area():
    """Where a narrow screen's main picture goes: the place `picture_slot` kept under the title
    (or, on a page without one, here); None on a wide screen."""
    if not narrow():
        return None
    slot = st.session_state.get(SLOT)
    st.session_state[SLOT] = None  # one picture per place: a second call gets a new one, in order
    return slot if slot is not None else st.container()
