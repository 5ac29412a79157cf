"""Links that reopen a view: every choice that shapes a view is a URL parameter named by its widget key.

A page creates such a widget through `bound`, which passes ``bind="query-params"`` to
Streamlit (1.55+): the widget then writes its value into the address bar and, when a page is
opened from a link, takes its value from there. Streamlit silently drops a value its widget cannot
take (a layer the model does not have, a word that is no option); `footer`, called at the
end of every page, says which values of the link were set aside, and tells the teacher that the
address bar is the link to share.

A choice shown through a ``format_func`` (``view``: "All heads (model view)" for ``grid``) is the
exception. Streamlit's binding writes and reads such a widget's *shown label* (streamlit 1.67:
``SelectboxSerde.serialize`` gives the formatted option, and ``SessionState._seed_widget_from_url``
drops any value that is not one of the formatted options), so ``?view=grid`` would be set aside.
`bound` manages these parameters itself (`_keyed`): when a page opens it reads the
link's value once, as the option's key or, for older links, its label; after the widget it writes
the key back, and leaves the parameter out at the default, as Streamlit does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.runtime.state.session_state_proxy import get_session_state

from attnviz.app.guard import guarded
from attnviz.app.text import escape_markdown

LINK_STATE = "_link"  # session key: the link's parameters at the start of this run, and how bound widgets show values
# Session key: per parameter, the URL values this session's own page had put there by the end of the
# last run. A callback (Next, a click on the grid, an example) changes a bound widget before the run
# starts, while the address bar still holds the value of the run before: that is the page's own
# change, not a link's value to set aside.
SEEN_STATE = "_link_seen"
PAGE_STATE = "_link_page"  # session key: the page the last run drew
KEYED_STATE = "_link_keyed"  # session key: the parameters `_keyed` writes (taken out where not drawn)
# Widgets whose options a link may name by key when a format_func shows them otherwise.
KEYED_WIDGETS = ("selectbox", "radio", "select_slider", "multiselect")


def start() -> None:
    """Note the URL's parameters before any widget of this run can drop one (the sidebar calls it first).

    Only a run that opens a page (a new session, or another page) reads the link: within a visit,
    every change of the address bar is the page's own (its widgets and callbacks, or Streamlit
    rewriting a value whose options changed), never a link to check.
    """
    page = page_hash()
    opened = st.session_state.get(PAGE_STATE, object()) != page
    st.session_state[PAGE_STATE] = page
    # A multiselect writes one parameter per value (?heads=1&heads=3); read them as the list it is.
    raw = {key: ",".join(st.query_params.get_all(key)) for key in st.query_params} if opened else {}
    # A parameter given more than once: a one-value widget takes the last (Streamlit's query_params.get).
    repeats = {key: st.query_params.get_all(key) for key in raw if len(st.query_params.get_all(key)) > 1}
    st.session_state[LINK_STATE] = {"raw": raw, "shown": {}, "repeats": repeats}


def page_hash() -> str | None:
    """Streamlit's hash of the page this session's run is on (None outside a run)."""
    ctx = get_script_run_ctx(suppress_warning=True)
    return ctx.page_script_hash if ctx is not None else None


def bound(widget: Callable, label: str, *args, key: str, format_func: Callable | None = None, **kwargs):
    """``widget(label, *args, key=key, ...)`` bound to the URL parameter ``key``; its value.

    ``format_func`` is how the widget shows (and the URL writes) each option, as for Streamlit.
    """
    shown = format_func or str
    st.session_state.setdefault(LINK_STATE, {"raw": {}, "shown": {}})["shown"][key] = shown
    name = getattr(widget, "__name__", "")
    if format_func is not None and name in KEYED_WIDGETS:
        return _keyed(widget, label, *args, key=key, format_func=format_func, **kwargs)
    if name in NUMERIC_WIDGETS and not _usable_number(st.query_params.get(key)):
        _drop_link_value(key)
    if format_func is not None:
        kwargs["format_func"] = format_func
    return widget(label, *args, key=key, bind="query-params", **kwargs)


def _keyed(widget: Callable, label: str, *args, key: str, format_func: Callable, **kwargs):
    """``widget`` with its URL parameter ``key`` holding the options' keys (``str(option)``), not their labels.

    A page that opens reads the link's value once (a key, or a label as older links wrote it); a
    value that is neither is left to `footer` to set aside. The widget itself is not bound:
    after it, the address bar gets the key, or loses the parameter when the choice is the default.
    """
    name = getattr(widget, "__name__", "")
    options = list(args[0] if args else kwargs["options"])
    many = name == "multiselect"
    link = st.session_state[LINK_STATE]
    if key in link["raw"]:  # a page opened from a link that names this choice
        wanted = st.query_params.get_all(key) if many else [st.query_params.get(key, "")]
        chosen = [option for raw in wanted if (option := _option_named(raw, options, format_func)) is not _NONE]
        if len(chosen) == len(wanted):
            st.session_state[key] = chosen if many else chosen[0]
    value = widget(label, *args, key=key, format_func=format_func, **kwargs)
    st.session_state.setdefault(KEYED_STATE, set()).add(key)
    if many:
        written = [str(option) for option in value] if list(value) != list(kwargs.get("default") or []) else []
    else:
        written = [] if value == _default_option(name, options, kwargs) or value is None else [str(value)]
    if st.query_params.get_all(key) != written:
        if written:
            st.query_params[key] = written if many else written[0]
        else:
            st.query_params.pop(key, None)
    return value


_NONE = object()  # no option has that name


def _option_named(raw: str, options: list, format_func: Callable):
    """The option whose key (``str(option)``) or shown label is ``raw``; `_NONE` if none."""
    for option in options:
        if str(option) == raw:
            return option
    for option in options:
        if str(format_func(option)) == raw:
            return option
    return _NONE


def _default_option(name: str, options: list, kwargs: dict):
    """The option a single-choice widget opens on when nothing chose another (Streamlit's own default)."""
    if name == "select_slider":
        return kwargs.get("value", options[0] if options else None)
    index = kwargs.get("index", 0)
    return options[index] if index is not None and options else None


def _drop_unshown_keyed() -> None:
    """Take out of the address bar the parameters of `_keyed` widgets that this run did not draw.

    (Streamlit does the same for its bound widgets: another page's or a hidden widget's value is no
    part of this view's link.)
    """
    drawn = (st.session_state.get(LINK_STATE) or {}).get("shown", {})
    for key in st.session_state.get(KEYED_STATE) or ():
        if key not in drawn and key in st.query_params:
            st.query_params.pop(key, None)


def _next_tab(key: str, names: list[str], delta: int) -> None:
    """Button callback: open the tab ``delta`` places on from the open one (runs before the rerun)."""
    current = st.session_state.get(key)
    at = names.index(current) if current in names else 0
    st.session_state[key] = names[min(max(at + delta, 0), len(names) - 1)]


NUMERIC_WIDGETS = ("number_input", "slider", "select_slider")
LARGEST_NUMBER = 2.0**53  # beyond, a float no longer holds every whole number


def _drop_link_value(key: str) -> None:
    """Take ``key``'s value out of the link before its widget reads it; the footer then sets it aside.

    Streamlit's own reading of such a value crashes the page (1e309 is infinity, and no whole
    number). A widget seeds itself from the link's *first* parameters, which only Streamlit's
    session keeps: after the parameter goes, they are made the current ones again.
    """
    st.query_params.pop(key, None)
    with get_session_state().query_params() as params:
        params.set_initial_query_params_from_current()


def range_from_link(key: str) -> None:
    """Let a link give a range slider's ``key`` as one value, ``2000-2090`` or ``2000,2090``, as people write a
    range, besides Streamlit's own ``key=2000&key=2090``: rewritten in Streamlit's form before the slider reads it.

    Streamlit reads one value as no range and drops it, so a hand-written zoom link opened on the first
    positions instead of its region. Either form is put in order: ``key=7&key=2`` had been read as the range
    7 to 2, an empty zoom (a tiled map's failed).
    """
    values = st.query_params.get_all(key)
    if len(values) == 1 and (found := re.fullmatch(r"\s*(\d+)\s*[-,:]\s*(\d+)\s*", values[0])):
        pair = found.groups()
    elif len(values) == 2 and all(re.fullmatch(r"\d+", v) for v in values) and int(values[0]) > int(values[1]):
        pair = values  # Streamlit's own form, high first (in order, the slider reads it as it is)
    else:
        return
    low, high = sorted(int(v) for v in pair)
    st.query_params[key] = [str(low), str(high)]
    with get_session_state().query_params() as params:
        params.set_initial_query_params_from_current()
    link = st.session_state.get(LINK_STATE) or {}
    if key in link.get("raw", {}):  # the footer compares the link's value with the slider's, written as it writes
        link["raw"][key] = f"{low},{high}"


def nearest_from_link(key: str, options: Sequence[int]) -> None:
    """Let a link name any number for a select slider ``key`` over the whole numbers ``options`` (a history's
    recorded steps): a finite number that is not one of them is rewritten to the nearest (the smaller on a
    tie) before the slider reads it. Anything else is left to the slider, which sets it aside.

    Only a run that opens the page from a link reads it (`start`): within a visit the parameter is the
    slider's own, which Streamlit does not let a page set, and the page clamps the slider's value.
    """
    link = st.session_state.get(LINK_STATE) or {}
    if key not in link.get("raw", {}):
        return
    raw = st.query_params.get(key)
    try:
        wanted = float(raw) if raw is not None else math.nan
    except ValueError:
        return
    if not math.isfinite(wanted) or abs(wanted) > LARGEST_NUMBER or not options:
        return
    nearest = min(options, key=lambda option: (abs(option - wanted), option))
    if str(nearest) == raw:
        return
    st.query_params[key] = str(nearest)
    with get_session_state().query_params() as params:
        params.set_initial_query_params_from_current()
    link["raw"][key] = str(nearest)  # the link's step, moved onto a record: shown, not set aside


def _usable_number(raw: str | None) -> bool:
    """Whether a link's value for a number widget is one Streamlit can read: absent, or finite and not huge.

    (Ranges, "3,7", and values the widget itself refuses are left to the widget: they are set aside.)
    """
    if raw is None:
        return True
    for part in str(raw).split(","):
        try:
            number = float(part)
        except ValueError:
            continue
        if not math.isfinite(number) or abs(number) > LARGEST_NUMBER:
            return False
    return True


def lazy_tabs(key: str, tabs: Mapping[str, Callable[[], None]]) -> None:
    """Tabs bound to the URL parameter ``key``: a link can open any of them, and only the open one runs.

    (Streamlit runs every tab of plain ``st.tabs``; bound to state, a tab knows whether it is open.)
    Two buttons step through them, also from the keyboard: Shift+Left and Shift+Right.
    """
    names = list(tabs)
    buttons = st.container(horizontal=True)  # each button as wide as its label: none is cut on a projector
    for label, shortcut, delta in (
        ("Previous tab", "Shift+Left", -1),
        ("Next tab", "Shift+Right", 1),
    ):
        buttons.button(
            label,
            key=f"_{key}_{'next' if delta > 0 else 'previous'}",
            on_click=_next_tab,
            args=(key, names, delta),
            shortcut=shortcut,
            help=shortcut,
        )
    for tab, draw in zip(bound(st.tabs, names, key=key), tabs.values(), strict=True):
        if tab.open:
            with tab:
                guarded(draw)


def _as_url(value, shown: Callable) -> set[str]:
    """The strings a URL may hold for ``value``: as the widget shows it, or as Python writes it."""
    if isinstance(value, (list, tuple)):
        return {",".join(shown(v) for v in value), ",".join(str(v) for v in value)}
    if isinstance(value, bool):
        return {str(value).lower(), str(value)}
    return {shown(value), str(value)}


def _taken(raw: str, value, shown: Callable) -> bool:
    """Whether the link's ``raw`` is the widget's ``value``: written as the widget writes it, or, for a number
    (or a range of numbers), the same number however written (20000, 2e4 and 20000.0 for a base of 20000.0)."""
    if raw in _as_url(value, shown):
        return True
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return False
    try:
        numbers = [float(part) for part in raw.split(",")]
    except ValueError:
        return False
    return numbers == [float(v) for v in values]


def set_aside() -> list[tuple[str, str]]:
    """(parameter, value) of the link that this page's widgets could not take.

    Only values that came from outside count: a value this session's page had itself put in the
    address bar by the end of the last run (`SEEN_STATE`) is never reported.
    """
    link = st.session_state.get(LINK_STATE) or {"raw": {}, "shown": {}}
    seen = st.session_state.get(SEEN_STATE) or {}
    aside = []
    for key, raw in link["raw"].items():
        shown = link["shown"].get(key)
        if shown is None or key not in st.session_state:
            continue  # a parameter of another page (or of no widget): none of this page's business
        if raw in seen.get(key, ()):
            continue  # the page's own value, from the run before: its widget may since have moved on
        value, repeated = st.session_state[key], link.get("repeats", {}).get(key)
        if repeated and not isinstance(value, (list, tuple)) and _taken(repeated[-1], value, shown):
            # the last was taken: the ones before it were not, unless they name the same (?layer=2&layer=2)
            if earlier := [r for r in repeated[:-1] if not _taken(r, value, shown)]:
                aside.append((key, ",".join(earlier)))
        elif not _taken(raw, value, shown):
            aside.append((key, raw))
    return aside


def remember_own_values() -> None:
    """Note, at the end of a run, which URL values this page itself holds (see `SEEN_STATE`)."""
    link = st.session_state.get(LINK_STATE) or {"raw": {}, "shown": {}}
    seen = {}
    for key, shown in link["shown"].items():
        values = set(_as_url(st.session_state[key], shown)) if key in st.session_state else set()
        if key in link["raw"]:
            values.add(link["raw"][key])  # the value the run started from: set aside once, not on every run
        seen[key] = values
    st.session_state[SEEN_STATE] = seen


def footer() -> None:
    """The end of every page: which link values were set aside, and how to share this view."""
    aside = set_aside()
    remember_own_values()
    _drop_unshown_keyed()
    if aside:  # the link's values are a visitor's text: shown as typed, never as markdown
        values = ", ".join(f"{key}={escape_markdown(repr(raw))}" for key, raw in aside)
        st.toast(f"This link's {values} cannot be shown here, so another value is shown.", icon=":material/link_off:")
        st.caption(f"Set aside from the link (not available here): {values}.")
    st.caption(
        ":material/link: Every choice on this page is in the address bar: copy it to share this exact view "
        "(the model, the sentences, the page and every setting)."
    )
