"""Follow the teacher: a presenter's room that other screens follow live (issue 34).

The presenter opens a room in the sidebar and gets a code, a link (``?follow=CODE``) and a QR
code of that link. From then on every run of the presenter's page publishes what the page shows
(`view_state`): the page, the link's parameters (the same ones the address bar holds, so every
choice that shapes a view) and the cell the presenter pointed at on a map. A page opened with
``?follow=CODE`` polls the room twice a second (`follower_bar`'s fragment, `_poll`: one read of
the room, and a heartbeat every `BEAT_S`) and, when the room's version changes, applies that state
exactly as a link is opened (`apply_state`): its values pass the same checks as any link's, and a
value the page cannot take is set aside. A poll that finds nothing new draws nothing: about 3 ms of
the server's CPU, nearly all of it Streamlit's own work for a fragment's run.

Only the presenter's session holds the room's secret (`ROOM_STATE`), which `publish` and `end`
require: it is never in a URL or drawn on a page. The presenter's browser tab keeps it too, in its
own sessionStorage, so that a reload or a restarted replica resumes the room (`keep_room`). A
follower holds the code only, so nothing it sends (widget values, a forged action) can change the
room. The rooms themselves live in `attnviz.app.rooms`, behind its functions (one store per
configuration); this module never touches a store.
"""

from __future__ import annotations

import io
import logging
import math
import secrets
import time
from typing import Any

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.runtime.state.query_params import QueryParams
from streamlit.runtime.state.session_state_proxy import get_session_state

from attnviz.app import links, registry, rooms
from attnviz.app.present import room
from attnviz.app.rooms.room import STATE_KEY
from attnviz.app.text import escape_markdown
from attnviz.figures.common import copied_spec, remade

log = logging.getLogger(__name__)

FOLLOW = "follow"  # the URL parameter of a follower's link
# Parameters that are a screen's own, never a room's: the room's code, and presenter mode (the
# projector's layout is no student's choice).
OWN_PARAMS = (FOLLOW, "present")
KEPT_PARAMS = ("embed", "embed_options")  # parameters st.switch_page keeps on every page
# Session keys a follower keeps when the room's state is applied: its device and presenter mode.
OWN_KEYS = ("device", "present")
ROOM_STATE = "_room"  # session key: the presenter's Room (code and secret), in this session only
PUBLISHED_STATE = "_room_published"  # session key: the last state the presenter published
FOLLOWING = "_following"  # session key: a follower's room: code, version applied, detached, its id
PAGE_NOW = "_room_page"  # session key: the address of the page being drawn (`start`)
DRAWING = "_room_drawing"  # session key: the pending view this run started with (`start`, `drawn`)
POINT = "_room_point"  # session key: the cell pointed at, {"chart", "x", "y"}, or absent
PAGE_KEY, POINT_KEY = "room_page", "room_point"  # a room's view: besides the link's parameters
POLL_S = 0.5  # how often a follower reads its room: a change shows within 1 s, the poll's wait included
# A view applied but not drawn (`_poll`): the follower's next poll this long after applies it again,
# at most RETRIES times for one version of the room.
RETRY_S, RETRIES = 2.0, 3
BEAT_S = 3.0  # how often a follower tells the room it is there (rooms count it for FOLLOW_WINDOW_S, 10 s)
COUNT_S = 3.0  # how often the presenter's count of followers is refreshed
MARK_COLOUR = "#ff00aa"  # the pointed cell's frame: a colour no weight map uses


# ---------------------------------------------------------------------------------------------
# What a room holds


def page_name() -> str:
    """The address below the app's root ("" for the home page) of the page this session's last run drew."""
    return st.session_state.get(PAGE_NOW, "")


def _address_bar() -> dict[str, list[str]]:
    """The address bar's parameters, every value of each."""
    return {k: list(st.query_params.get_all(k)) for k in st.query_params}


def view_state() -> dict[str, Any]:
    """What this page shows, as a room publishes it: the address bar's parameters, `PAGE_KEY` and `POINT_KEY`.

    Each parameter is a string, or a list of strings for a multiple choice; this screen's own
    (`OWN_PARAMS`) are left out. `PAGE_KEY` is the page's address and `POINT_KEY` the cell pointed
    at, [chart, column label, row label], or None. (A room's view is flat, link-style values:
    `attnviz.app.rooms.check_state`.)
    """
    state: dict[str, Any] = {}
    for key, values in _address_bar().items():
        if key in OWN_PARAMS or key in (PAGE_KEY, POINT_KEY) or not STATE_KEY.fullmatch(key):
            continue  # not one of the app's parameters (?utm-source=...): no part of the view, as a link's is set aside
        state[key] = values[0] if len(values) == 1 else values
    point = st.session_state.get(POINT)
    state[PAGE_KEY] = page_name()
    state[POINT_KEY] = [point["chart"], point["x"], point["y"]] if point else None
    return state


def page_path(name: str) -> str:
    """The registry's file for the page whose address is ``name`` (the home page for an unknown one)."""
    for entry in registry.PAGES:
        if entry.url_path == name:
            return entry.path
    return registry.PAGES[0].path


# ---------------------------------------------------------------------------------------------
# The presenter


def presenting_room() -> rooms.Room | None:
    """This session's room when it presents one (it holds the secret), else None."""
    return st.session_state.get(ROOM_STATE)


def _open() -> None:
    """Button callback: open a room on this page's view (runs before the rerun)."""
    try:
        state = view_state()
        st.session_state[ROOM_STATE] = rooms.open_room(state)
        st.session_state[PUBLISHED_STATE] = state
    except rooms.RoomError as e:  # a bound reached, or a store that does not answer
        st.session_state["_room_error"] = str(e)


def _end() -> None:
    """Button callback: end this session's room (runs before the rerun)."""
    mine = st.session_state.pop(ROOM_STATE, None)
    st.session_state.pop(PUBLISHED_STATE, None)
    st.session_state[KEPT] = "forget"  # the tab forgets the room too
    st.session_state.pop(POINT, None)
    if mine is not None:
        try:
            rooms.end(mine.code, mine.secret)
        except rooms.RoomError as e:  # a store that does not answer: the room ends with its time limit
            log.warning("could not end room %s: %s", mine.code, e)


# The presenter's tab keeps its room: a reload, or a replica killed and restarted, starts a new
# session that holds no secret, while the room lives on in the store. So the tab keeps the room's
# code and secret in its own sessionStorage (never in a URL or on the page, and no other tab or
# screen can read it), and a new session of that tab asks for it once: `keep_room` below.
KEEP_KEY = "_room_keep"  # the component's key ("_": no choice of the pages, not carried across them)
KEPT = "_room_kept"  # session key: this session's token for the tab's one question, or "forget"
SECRET_CHARS = 64  # a claimed secret longer than this is no secret of ours (ours are 32 characters)
_KEEP_JS = """
export default function ({ data, setTriggerValue }) {
    const slot = "attnviz.room";
    if (data.keep) {
        sessionStorage.setItem(slot, JSON.stringify(data.keep));
    } else if (data.forget) {
        sessionStorage.removeItem(slot);
    } else if (data.ask && window.attnvizRoomAsked !== data.ask) {
        window.attnvizRoomAsked = data.ask;  // once per session: a session that learnt nothing asks no more
        const kept = sessionStorage.getItem(slot);
        if (kept) {
            setTriggerValue("claim", JSON.parse(kept));
        }
    }
}
"""
_keeper = st.components.v2.component("attnviz.room_keeper", js=_KEEP_JS)


def keep_room() -> None:
    """Tell the presenter's tab to keep its room, or ask a new session's tab for the room it kept.

    A presenter's every run hands the tab its room (code and secret); a session with no room asks its
    tab once whether it presented one, a follower's too (a presenter's tab reloaded at a room's link
    presents again: `presents_here`; it had forgotten its room, which no one could then end); a room
    ended, or refused when claimed, is forgotten. The component draws nothing; the frame calls this
    at the page's end.
    """
    mine = presenting_room()
    if mine is not None:
        data: dict[str, Any] = {"keep": {"code": mine.code, "secret": mine.secret}}
    elif st.session_state.get(KEPT) == "forget":
        data = {"forget": True}
    else:
        data = {"ask": st.session_state.setdefault(KEPT, secrets.token_hex(8))}
    st.html(f"<style>.st-key-{KEEP_KEY} {{ display: none; }}</style>")
    _keeper(key=KEEP_KEY, data=data, on_claim_change=_claimed)


def _claimed() -> None:
    """The component's callback: a tab handed back the room it kept; resume it when it is live and ours."""
    claim = (st.session_state.get(KEEP_KEY) or {}).get("claim")
    if presenting_room() is not None or not isinstance(claim, dict):
        return
    code, secret = claim.get("code"), claim.get("secret")
    if not isinstance(code, str) or not isinstance(secret, str) or not 0 < len(secret) <= SECRET_CHARS:
        st.session_state[KEPT] = "forget"
        return
    try:
        st.session_state[ROOM_STATE] = rooms.resume(code, secret)
    except rooms.RoomError as e:
        if getattr(e, "reason", "") in GONE + ("secret",):
            st.session_state[KEPT] = "forget"  # nothing to come back to
        else:  # the store does not answer: the tab keeps the room for the next session
            st.session_state["_room_error"] = f"{e} Your room is kept; reload the page when the store answers."
        return
    st.session_state.pop(PUBLISHED_STATE, None)  # the page's view is published at the run's end
    if st.session_state.get(FOLLOWING) is not None:  # the tab was reloaded at a room's link
        presents_here(st.session_state[ROOM_STATE])
    log.info("room %s resumed by its presenter in a new session", code)


def follow_link(code: str) -> str:
    """The link that follows room ``code`` from this server: its address as the browser reached it."""
    base = ""
    try:
        base = st.context.url or ""
    except Exception:  # noqa: BLE001 - no browser (AppTest): a link relative to the server
        base = ""
    base = base.split("?", 1)[0]
    name = page_name()
    if name and base.rstrip("/").endswith("/" + name):
        base = base.rstrip("/")[: -len(name)]
    return f"{base.rstrip('/')}/?{FOLLOW}={code}"


def qr_png(text: str) -> bytes:
    """A PNG picture of a QR code (error correction M) holding ``text``: black on white, 8 px a module,
    with its quiet zone of 4 modules, so that a phone reads it off a projector."""
    import segno

    out = io.BytesIO()
    segno.make(text, error="m", micro=False, boost_error=False).save(
        out, kind="png", scale=8, border=4, dark="#000000", light="#ffffff"
    )
    return out.getvalue()


def presenter_panel() -> None:
    """The sidebar's room panel: "Open a room", or the open room's code, link, QR code, followers and "End"."""
    if st.session_state.get(FOLLOWING) is not None:
        return  # a follower's screen follows; it opens no room of its own
    st.divider()
    error = st.session_state.pop("_room_error", None)
    if error:
        st.warning(escape_markdown(error))  # a room's errors quote what they refuse: a visitor's text
    mine = presenting_room()
    if mine is None:
        st.button(
            "Open a room",
            key="_room_open",
            icon=":material/co_present:",
            on_click=_open,
            help="Screens that open the room's link follow this one: its page, text, model and every choice, live.",
        )
        return
    link = follow_link(mine.code)
    st.markdown(f"**Room {mine.code}**")
    st.caption("Screens that open this link follow yours:")
    st.code(link, language=None)
    st.image(qr_png(link), width=220, caption=f"The link as a QR code, for phones: room {mine.code}")
    _followers(mine.code)
    st.button("End the room", key="_room_end", icon=":material/cancel_presentation:", on_click=_end)


@st.fragment(run_every=COUNT_S)
def _followers(code: str) -> None:
    """How many screens follow room ``code``, and whether the presenter's latest change is still to reach them
    (its write failed and is tried again: `rooms.unwritten`), refreshed every `COUNT_S` seconds."""
    unwritten = rooms.unwritten(code)
    if unwritten:
        st.warning(unwritten)
    try:
        seen = rooms.read(code)
    except rooms.RoomError as e:
        st.warning(escape_markdown(str(e)))
        return
    st.caption(f":material/group: {seen.followers} screen{'s' if seen.followers != 1 else ''} following")


def publish_view() -> None:
    """At the end of a presenter's run: publish the page's view when it changed since the last one.

    A store that does not answer leaves the presenter presenting, with a warning, and the next run
    tries again; a change the rooms coalesced is theirs to write, again until it lands (the room
    panel says so meanwhile: `_followers`). A room that ended (its time limit) is let go.
    """
    mine = presenting_room()
    if mine is None:
        return
    state = view_state()
    if state == st.session_state.get(PUBLISHED_STATE):
        return
    try:
        rooms.publish(mine.code, mine.secret, state)
    except rooms.RoomError as e:
        if getattr(e, "reason", "") in GONE + ("secret",):
            st.session_state.pop(ROOM_STATE, None)
            st.session_state[KEPT] = "forget"
            st.warning(escape_markdown(str(e)))
        elif getattr(e, "reason", "") == "state":
            st.warning(f"{escape_markdown(str(e))} The class keeps the view before.")
        else:  # the store: the next change tries again
            st.warning(
                f"{escape_markdown(str(e))} Your screen keeps presenting; the class sees your view when the store "
                "answers."
            )
        return
    st.session_state[PUBLISHED_STATE] = state


# ---------------------------------------------------------------------------------------------
# The pointed cell


def point_from_click(chart: str) -> None:
    """A click on a map's cell (``chart`` is its key): that cell becomes the room's pointed cell."""
    event = st.session_state.get(chart)
    points = event.selection.points if event is not None else []
    if not points or "x" not in points[0] or "y" not in points[0]:
        st.session_state.pop(POINT, None)
        return
    st.session_state[POINT] = {"chart": chart, "x": str(points[0]["x"]), "y": str(points[0]["y"])}


def marked(fig: go.Figure, chart: str) -> go.Figure:
    """``fig`` with the pointed cell framed, when it is on chart ``chart``; ``fig`` itself otherwise.

    The cell is found by its labels among the first trace's (labels are position-prefixed, so unique).
    """
    point = st.session_state.get(POINT)
    if not point or point.get("chart") != chart or not fig.data:
        return fig
    xs, ys = list(fig.data[0].x or ()), list(fig.data[0].y or ())
    if point["x"] not in xs or point["y"] not in ys:
        return fig
    col, row = xs.index(point["x"]), ys.index(point["y"])
    data, layout = copied_spec(fig)
    frame = {
        "type": "rect",
        "x0": col - 0.5,
        "x1": col + 0.5,
        "y0": row - 0.5,
        "y1": row + 0.5,
        "line": {"color": MARK_COLOUR, "width": 4},
        "name": "pointed",
    }
    return remade(data, {**layout, "shapes": [*layout.get("shapes", []), frame]})


def clickable(fig: go.Figure) -> go.Figure:
    """``fig`` with an invisible point on each cell of its first trace (a heatmap), so that a click selects a cell.

    Plotly selects points of scatter traces only: a click on a heatmap reaches Streamlit as no
    selection at all. The points carry the heatmap's own hover text; a map that is an image
    (a long text) is returned as it is.
    """
    if not fig.data or getattr(fig.data[0], "type", "") != "heatmap" or fig.data[0].x is None:
        return fig
    heat = fig.data[0]
    xs, ys = list(heat.x), list(heat.y)
    values = np.asarray(heat.customdata if heat.customdata is not None else heat.z, dtype=np.float64)
    name = heat.name or "weight"
    cells = go.Scatter(
        x=[x for _ in ys for x in xs],
        y=[y for y in ys for _ in xs],
        customdata=values.reshape(-1),
        mode="markers",
        marker={"size": 12, "opacity": 0},
        selected={"marker": {"opacity": 0}},
        unselected={"marker": {"opacity": 0}},
        hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{name} %{{customdata:.6f}}<extra></extra>",
        showlegend=False,
        name="cells",
    )
    data, layout = copied_spec(fig)
    return remade([*data, cells.to_plotly_json()], {**layout, "hoverdistance": -1, "clickmode": "event+select"})


def map_chart(where, fig: go.Figure, chart: str, share: float = 1.0, **kwargs) -> None:
    """A weight map drawn in ``where``, ``chart`` its key; the room's pointed cell is framed on it.

    On a presenter's screen a click on a cell points at it (`point_from_click`). Only there is the
    map made clickable: the invisible points cost about 10 ms of the server's time per drawing (a
    12 x 12 map), which every follower would pay on every change and a visitor with no room on
    every rerun, for clicks that change nothing in a room.
    """
    shown = room(marked(fig, chart), share)
    if presenting_room() is None:
        where.plotly_chart(shown, width="stretch", key=chart, **kwargs)
        return
    where.plotly_chart(
        clickable(shown),
        width="stretch",
        key=chart,
        on_select=lambda: point_from_click(chart),
        selection_mode="points",
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------
# The follower


def start(page: str) -> None:
    """Note the page being drawn (its address, ``page``) and the room a page opened with ``?follow=CODE``
    follows: every page calls it before the sidebar.

    A malformed code is kept too: `follower_bar` says what is wrong with it in one line.
    """
    st.session_state[PAGE_NOW] = page
    st.session_state.pop(DRAWING, None)  # a run stopped before its end (`drawn`) left it: not this run's
    code = st.query_params.get(FOLLOW)
    if code is None:
        return
    mine = presenting_room()
    if mine is not None:
        presents_here(mine)
        return
    following = st.session_state.get(FOLLOWING)
    if following is not None and following.get("link") == code:  # the link as given: "code" is trimmed
        wanted = following.get("pending")
        if wanted is not None and wanted == (page_path(page), _view_params(_address_bar())):
            st.session_state[DRAWING] = wanted  # drawn once this run reaches its end (`drawn`)
        return
    st.session_state[FOLLOWING] = {
        "link": code,
        "code": code.strip()[:64],
        "version": None,
        "detached": False,
        "id": secrets.token_hex(8),
    }


def presents_here(mine: rooms.Room) -> None:
    """A tab that presents room ``mine`` and opens a room's link: it keeps presenting, and says where a link is
    followed. Followed there, it had published the other room's views to its own class, with its room panel (and
    "End the room") gone."""
    st.session_state.pop(FOLLOWING, None)
    st.session_state.pop(DRAWING, None)
    st.session_state["_room_error"] = (
        f"This tab presents room {mine.code}, so it follows no room: open a room's link in another tab or on "
        "another screen, or end this room first."
    )
    if FOLLOW in st.query_params:
        del st.query_params[FOLLOW]


def _page_lost() -> bool:
    """Whether this session is on another page than the one its last whole run drew (`links.start` notes it).

    A fragment's run can move a session to another page: Streamlit runs a fragment's rerun on the page
    the browser asked from (streamlit 1.67, ScriptRunner._run_script), and a follower's browser can ask
    from the page it was on before a switch reached it (the poll's own timer). The screen then shows one
    page while its session and address bar are on another, and the next whole run draws the wrong one.
    """
    now = links.page_hash()
    return now is not None and st.session_state.get(links.PAGE_STATE, now) != now


def _whole_run() -> bool:
    """Whether this run is the whole page's, not a fragment's alone (streamlit 1.67: a fragment's run lists its
    fragments in the run's context; tests/test_follow.py checks that it still does).

    A fragment's run comes between whole runs, never during one: a `DRAWING` it finds was left by a whole run
    that stopped before its end, and the view it names is not drawn.
    """
    ctx = get_script_run_ctx(suppress_warning=True)
    return ctx is None or not ctx.fragment_ids_this_run


def drawn() -> None:
    """At the end of a follower's run: the view applied (`apply_state`) is drawn if this run started with it.

    Not at the run's start: a run that starts with the view can still be replaced before its end by a rerun
    the browser asks for, which carries the old page's widget values, and the follower would keep the old
    view until the presenter's next change. A view not drawn stays pending, and `_poll` applies it again.
    """
    following = st.session_state.get(FOLLOWING)
    started = st.session_state.pop(DRAWING, None)
    if following is not None and started is not None and following.get("pending") == started:
        del following["pending"]


def _view_params(params: dict[str, list[str]]) -> dict[str, list[str]]:
    """The parameters of ``params`` that make a view: all but a screen's own and those Streamlit keeps on
    every page."""
    return {k: list(v) for k, v in params.items() if k not in (*OWN_PARAMS, *KEPT_PARAMS)}


def apply_state(state: dict[str, Any], code: str) -> None:
    """Make this page show the room's ``state`` as its link would open it; reruns (on its page).

    Every kept widget value goes, the room's parameters become the address bar's and the page reads
    them as a link (`attnviz.app.links.start`): the same checks, the same values set aside. A page
    that keeps part of a view under a key of its own ("_"-named, which stays: the worked example's
    matrices) takes that part from the link as it opens, so a follower coming back to the class
    shows the presenter's, not its own. What it asks for is noted in the session's `FOLLOWING` as
    ``pending`` (the page's file and the parameters) until a run of the page that started with
    them reaches its end (`start`, `drawn`).
    """
    for key in list(st.session_state.keys()):
        if not key.startswith(("_", "$$")) and key not in OWN_KEYS:
            del st.session_state[key]
    st.session_state.pop(links.PAGE_STATE, None)
    st.session_state.pop(links.SEEN_STATE, None)
    point = state.get(POINT_KEY)
    if isinstance(point, list) and len(point) == 3 and all(isinstance(v, str) for v in point):
        st.session_state[POINT] = {"chart": point[0], "x": point[1], "y": point[2]}
    else:
        st.session_state.pop(POINT, None)
    # A screen's own parameters, and Streamlit's embed ones: no presenter's address bar lists those (st.query_params
    # leaves them out), and st.switch_page raised on a view that named them (a forged one): a traceback on every
    # follower's page.
    params = {k: v for k, v in _link_params(state).items() if k.lower() not in (*OWN_PARAMS, *KEPT_PARAMS)}
    target = page_path(str(state.get(PAGE_KEY, "")))
    following = st.session_state.get(FOLLOWING)
    if following is not None:
        following["pending"] = (target, _view_params(params))
    params[FOLLOW] = [code]
    if "present" in st.query_params:
        params["present"] = st.query_params.get_all("present")
    open_link(target, params)


def open_link(target: str, params: dict[str, list[str]]) -> None:
    """Open page ``target`` as the link ``?params`` would: its widgets take their values from ``params``.

    Streamlit reads a link's values into widgets that have none yet (the session keys are gone:
    `apply_state`) from the query string the page is opened with: ``st.switch_page``'s
    ``query_params`` become the address bar's and the next run's. It refuses to set a parameter
    that a widget is bound to, so those bindings are let go first (`let_go`); each widget binds
    again as it is drawn.
    """
    with get_session_state().query_params() as qp:
        let_go(qp, [*params, *st.query_params])
    st.switch_page(target, query_params=params)


def let_go(qp: QueryParams, keys: list[str]) -> None:
    """Unbind from their widgets the parameters ``keys`` of the session's `QueryParams` ``qp``.

    The one use of Streamlit's internals in this module (streamlit 1.67: no public call unbinds a
    widget from its parameter); tests/test_follow.py checks that these methods still do this.
    """
    for key in keys:
        binding = qp.get_binding_for_param(key)
        if binding is not None:
            qp.unbind_widget(binding.widget_id)


def _link_params(state: Any) -> dict[str, list[str]]:
    """A room's link parameters as {name: [strings]}: its page and point, and anything else, left out."""
    if not isinstance(state, dict):
        return {}
    out = {}
    for key, value in state.items():
        values = [value] if isinstance(value, str) else value
        if key in (PAGE_KEY, POINT_KEY) or not isinstance(key, str) or not isinstance(values, list):
            continue
        if values and all(isinstance(v, str) for v in values):
            out[key] = values
    return out


def _detach() -> None:
    st.session_state[FOLLOWING]["detached"] = True


def _rejoin() -> None:
    st.session_state[FOLLOWING]["detached"] = False
    st.session_state[FOLLOWING]["version"] = None  # the presenter's current view, at once


# RoomError reasons after which polling stops: nothing will come. A record that is not a room's ("unreadable")
# does not mend: its followers had read it twice a second, each read an ERROR line in the log.
GONE = ("code", "unknown", "ended", "expired", "unreadable")


def follower_bar() -> None:
    """A follower's line above the page ("Following room ABC123 · Explore on my own"); it polls the room.

    A code that is malformed, unknown or ended gets one line, and the page is the visitor's own. A
    detached screen ("Explore on my own") does not poll: "Back to the class" polls again at once.
    """
    following = st.session_state.get(FOLLOWING)
    if following is None:
        return
    if following.get("gone"):
        st.warning(escape_markdown(following["gone"]))
        return
    code = escape_markdown(following["code"])  # the link's text, as typed: never markdown
    line = st.container(horizontal=True, vertical_alignment="center")
    if following["detached"]:
        line.markdown(f":material/explore: Exploring on my own: room **{code}** goes on")
        line.button("Back to the class", key="_follow_rejoin", on_click=_rejoin, icon=":material/group:")
        return
    line.markdown(f":material/cast_for_education: Following room **{code}**")
    line.button("Explore on my own", key="_follow_detach", on_click=_detach, icon=":material/explore:")
    _poll()


@st.fragment(run_every=POLL_S)
def _poll() -> None:
    """Read the room and apply the presenter's view when its version moved on; tell the room this screen is
    there every `BEAT_S` seconds.

    It runs twice a second on every follower's screen, so a poll that finds nothing new draws nothing and
    costs one read of the room (the line above the page is drawn by the page, once).
    """
    following = st.session_state.get(FOLLOWING)
    if following is None or following.get("gone") or following["detached"]:
        return
    code = following["code"]
    try:
        now = time.monotonic()
        if now - following.get("beat", -math.inf) >= BEAT_S:
            rooms.follow(code, following["id"])
            following["beat"] = now
        seen = rooms.read(code)
    except rooms.RoomError as e:
        if getattr(e, "reason", "") in GONE:
            following["gone"] = f"{e} This page is yours to explore."
            st.rerun()  # the whole page: the line is drawn outside this fragment, which stops polling
        st.warning(
            f"{escape_markdown(str(e))} This page works on its own meanwhile; it follows again when the room answers."
        )
        return
    if seen.version != following["version"]:
        following.update(version=seen.version, applied=now, tries=1)
        apply_state(seen.state, code)
    pending, lost = following.get("pending"), _page_lost()
    drawing = pending == st.session_state.get(DRAWING) and _whole_run()
    if not lost and (pending is None or drawing or now - following["applied"] < RETRY_S):
        return
    # Applied, yet no run of the page has drawn it to its end (and this run, if a whole page's, is not
    # drawing it): Streamlit folds a rerun the browser asks for (this fragment's own timer) into a
    # pending st.switch_page, and the browser's request, with its page and address, wins (streamlit
    # 1.67, ScriptRequests._request_rerun_locked), or such a rerun replaces the run that started with
    # the view (`drawn`). Or the view was drawn, and then a fragment's run moved the session to the page
    # before (`_page_lost`): applied again at once. Rare, and the follower would keep the wrong view
    # until the presenter's next change.
    if following.get("tries", 0) >= RETRIES:
        if following.get("tries") == RETRIES:
            log.warning("room %s: a follower's page did not take the room's view after %d tries", code, RETRIES)
        following.pop("pending", None)
        following["tries"] = RETRIES + 1  # given up on this version of the room: said once
        return
    following.update(applied=now, tries=following.get("tries", 0) + 1)
    log.info(
        "room %s: a follower's page %s; applying it again", code, "left it" if lost else "did not draw the room's view"
    )
    apply_state(seen.state, code)
