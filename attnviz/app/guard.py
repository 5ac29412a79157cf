"""The app's one error guard: a visitor sees a clear message, never a traceback."""

from __future__ import annotations

import logging
from collections.abc import Callable

import streamlit as st

from attnviz.app.text import escape_markdown
from attnviz.errors import AttnvizError

log = logging.getLogger(__name__)


def show_error(e: Exception) -> None:
    """A clear message for the people using the app, never a traceback, and never a server's secrets.

    A visitor sees `AttnvizError.public`, which names no server path and quotes nothing read
    from a file; the full message, and the traceback of an error nobody foresaw, go to the server's log.
    """
    if isinstance(e, AttnvizError):
        st.error(escape_markdown(e.public))  # it may quote what a visitor typed: shown as text, never as markdown
        if e.public != str(e):
            log.warning("shown to a visitor as %r: %s", e.public, e)
    else:
        log.error("unexpected error in the app", exc_info=e)
        st.error(f"Something went wrong ({type(e).__name__}); the details are in the server's log.")


def guarded(draw: Callable[[], None]) -> None:
    """Run ``draw``; an error in it becomes a message (`show_error`) and ends ``draw`` only.

    The one guard of the app: the frame runs each page body in it and `attnviz.app.links.lazy_tabs`
    each tab, so a failing tab leaves the page's other parts standing. Streamlit's own stop and rerun
    signals are BaseExceptions, not Exceptions, and pass through.
    """
    try:
        draw()
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
