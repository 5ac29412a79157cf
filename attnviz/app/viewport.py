"""Phones: how wide the visitor's screen is, and the page's order on a narrow one.

The server builds every figure and never sees the screen, and Streamlit 1.67's ``st.context``
says nothing of its size. So a small script in the page (`watch`, an ``st.components.v2``
component with no visible content, drawn at the end of every page) asks the browser
whether its window is under `NARROW_PX` and, when that differs from what the server
believes, says so: one more run then draws the page for a phone. It asks again when the window
crosses the line (a phone turned sideways).

On a narrow screen a page's main picture comes right after the title (`picture_slot`), the
figures take their narrow layout (``narrow=True`` of `attnviz.figures.attention.attention_heatmap`),
with room above the title for plotly's toolbar. At `NARROW_PX` and wider nothing changes.
"""

from __future__ import annotations

import streamlit as st

NARROW_PX = 640  # a window narrower than this (a phone, upright or sideways) gets the narrow layout
NARROW = "_narrow"  # session key: whether the browser said its window is narrow (absent: not yet, drawn wide)
SLOT = "_picture_slot"  # session key: this run's place for the main picture, right under the title
WATCH_KEY = "_viewport"  # the component's key ("_": not a choice the pages carry across, see session.keep_state)

# The browser's side: report whether the window is narrow whenever that differs from what the
# server last drew for (``data.narrow``), now and when the window crosses NARROW_PX. Once the
# server has drawn for this window, <html data-attnviz-drawn="narrow" or "wide"> says so (what a
# browser test waits for).
_JS = """
export default function ({ data, setStateValue }) {
    const query = window.matchMedia(`(max-width: ${data.below - 0.02}px)`);
    let drawn = data.narrow;
    const report = () => {
        if (query.matches !== drawn) {
            drawn = query.matches;
            delete document.documentElement.dataset.attnvizDrawn;
            setStateValue("narrow", drawn);
        }
    };
    if (query.matches === data.narrow) {
        document.documentElement.dataset.attnvizDrawn = data.narrow ? "narrow" : "wide";
    }
    report();
    query.addEventListener("change", report);
    return () => query.removeEventListener("change", report);
}
"""

_watcher = st.components.v2.component("attnviz.viewport", js=_JS)
# The component shows nothing, but its place in the page would add a gap under the footer: out of the layout.
_HIDDEN = f"<style>.st-key-{WATCH_KEY} {{ display: none; }}</style>"


def narrow() -> bool:
    """Whether this session's browser said that its window is narrower than `NARROW_PX`."""
    return bool(st.session_state.get(NARROW, False))


def _reported() -> None:
    """The component's callback: keep what the browser said, for the runs and pages that follow."""
    state = st.session_state.get(WATCH_KEY)
    st.session_state[NARROW] = bool(state and state.get("narrow"))


def watch() -> None:
    """Ask the browser whether its window is narrow (see the module's text). The frame calls it at the
    page's end: the component is out of the layout, and the page's own elements keep their places."""
    st.html(_HIDDEN)  # style alone: Streamlit puts it where it takes no space
    _watcher(key=WATCH_KEY, data={"below": NARROW_PX, "narrow": narrow()}, on_narrow_change=_reported)


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
