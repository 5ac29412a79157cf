"""Follow the teacher (issue 34), in AppTest: a presenter's room, a follower's link, bad codes, the secret.

Two AppTests are two sessions of one server; the rooms live in a SQLite store in a temporary folder.
AppTest runs no timer, so a follower's poll is a run (`at.run()`), as the fragment's timer would start it.
Where the presenter's page is not what a test checks, the test drives the room through
`attnviz.app.rooms` itself, with a view as the presenter's page publishes it (one AppTest less).
The browser tests (test_browser_follow.py) check the same in chromium, within the 1 s bound.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import time

import numpy as np
import plotly.graph_objects as go
import pytest
from conftest import open_app, open_from_link

from attnviz.app import follow, links, rooms
from attnviz.app.rooms.store import StoreError


@pytest.fixture
def room_store(monkeypatch, tmp_path):
    """Rooms in a SQLite file of this test's own; every change written at once (none coalesced)."""
    monkeypatch.delenv("ATTNVIZ_ROOMS_URL", raising=False)
    monkeypatch.setenv("ATTNVIZ_ROOMS_DIR", str(tmp_path / "rooms"))
    monkeypatch.setenv("ATTNVIZ_ROOM_PUBLISHES_PER_S", "1000000")


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The codes of every `rooms.read` the pages make, in order."""
    seen, read = [], rooms.read

    def counted(code):
        seen.append(code)
        return read(code)

    monkeypatch.setattr(rooms, "read", counted)
    return seen


def _view(page: str, **params: str) -> dict:
    """A room's view as a presenter's page publishes it (`follow.view_state`): the link's parameters, page and point."""
    return {**params, follow.PAGE_KEY: page, follow.POINT_KEY: None}


def _texts(at) -> str:
    """Everything an AppTest's page shows as text, and its address bar."""
    parts = [str(e.value) for kind in ("markdown", "caption", "warning", "info", "error", "code") for e in at.get(kind)]
    return "\n".join(parts) + "\n" + str(dict(at.query_params))


def _open_room(at) -> rooms.Room:
    at.sidebar.button(key="_room_open").click().run()
    assert not at.exception, at.exception
    mine = at.session_state[follow.ROOM_STATE]
    assert isinstance(mine, rooms.Room)
    return mine


def test_the_qr_code_holds_the_link():
    """The QR code the sidebar shows, read back by an independent decoder (zxing-cpp), holds the follow link."""
    zxingcpp = pytest.importorskip("zxingcpp")
    from PIL import Image

    link = "http://192.168.1.20:8501/?follow=K7QX2M"
    picture = Image.open(io.BytesIO(follow.qr_png(link))).convert("L")
    found = zxingcpp.read_barcodes(np.asarray(picture))
    assert [(r.text, r.format.name) for r in found] == [(link, "QRCode")]


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_a_follower_gets_the_presenters_page_and_view_and_never_the_secret(room_store):
    presenter = open_app("pages/explorer.py")
    mine = _open_room(presenter)
    assert any(mine.code in str(c.value) for c in presenter.sidebar.get("markdown"))
    presenter.sidebar.text_area(key="src").set_value("the secret never shows").run()
    presenter.selectbox(key="layer").set_value(2).run()
    presenter.selectbox(key="head").set_value(3).run()
    assert not presenter.exception, presenter.exception
    follower = open_from_link("app.py", {"follow": mine.code})  # the link opens on any page: here home
    assert not follower.exception, follower.exception
    assert follower.title[0].value == "Attention explorer"
    assert (follower.session_state["layer"], follower.session_state["head"]) == (2, 3)
    assert f"Following room **{mine.code}**" in _texts(follower)
    # the follower's address bar is the view's link (and the room's): copied, it opens the same view
    shown = dict(follower.query_params)
    assert (shown["follow"], shown["layer"], shown["head"]) == (mine.code, "2", "3"), shown
    assert shown["src"] == "the secret never shows"
    assert rooms.read(mine.code).followers == 1
    for at in (presenter, follower):  # what the pages show, and their address bars
        assert mine.secret not in _texts(at)
    assert follow.ROOM_STATE not in follower.session_state
    assert mine.secret not in str(rooms.read(mine.code))

    presenter.selectbox(key="head").set_value(1).run()  # a change: the follower's next poll applies it
    follower.run()
    assert follower.session_state["head"] == 1
    shown = dict(follower.query_params)
    assert shown.pop("follow") == mine.code and shown == dict(presenter.query_params), "the same link, and the room"


def test_let_go_unbinds_a_parameter_so_that_a_link_can_set_it():
    """`follow.let_go` uses Streamlit's own query-parameter bindings: this fails if Streamlit changes them."""
    from streamlit.errors import StreamlitAPIException
    from streamlit.runtime.state.query_params import QueryParams

    qp = QueryParams()
    qp.bind_widget("head", "$$ID-1-head", "string_value", "page")
    qp.bind_widget("layer", "$$ID-2-layer", "string_value", "page")
    with pytest.raises(StreamlitAPIException):  # why apply_state lets go: a bound parameter cannot be set
        qp.update({"head": "3"})
    follow.let_go(qp, ["head", "not bound"])
    assert not qp.is_bound("head") and qp.is_bound("layer")
    qp.update({"head": "3"})
    assert qp.get_all("head") == ["3"]


def test_detach_keeps_the_view_and_rejoin_takes_the_presenters(room_store, reads):
    mine = rooms.open_room(_view("explorer", head="2"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert follower.session_state["head"] == 2
    follower.button(key="_follow_detach").click().run()
    assert "Exploring on my own" in _texts(follower)
    rooms.publish(mine.code, mine.secret, _view("explorer", head="4"))
    polled = len(reads)
    follower.run()
    follower.run()
    assert follower.session_state["head"] == 2  # detached: the presenter's change is not applied
    assert len(reads) == polled, "a detached screen does not poll its room"
    follower.button(key="_follow_rejoin").click().run()
    assert not follower.exception, follower.exception
    assert follower.session_state["head"] == 4
    assert f"Following room **{mine.code}**" in _texts(follower)


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_a_follower_measures_over_the_presenters_importance_sentences(room_store):
    """Beyond the weights: the sentences head importance is measured over, and the switch that measures, are the
    presenter's on every follower's screen (they had been each screen's own: followers measured the model's
    examples). The model's own examples, the page's default, stay out of the link."""
    presenter = open_app("pages/beyond.py")
    mine = _open_room(presenter)
    assert "bw_imp_text" not in presenter.query_params
    presenter.toggle(key="bw_imp_on").set_value(False).run()
    presenter.text_area(key="bw_imp_text").set_value("the teacher's own sentence").run()
    assert not presenter.exception, presenter.exception
    follower = open_from_link("app.py", {"follow": mine.code})
    assert not follower.exception, follower.exception
    assert follower.title[0].value == presenter.title[0].value
    shown = (follower.session_state["bw_imp_on"], follower.session_state["bw_imp_text"])
    assert shown == (False, "the teacher's own sentence"), shown


def _worked_example(at) -> list[str]:
    """The Mechanics page's tables of the worked example, as text: Q, K, V, the scores, weights and output."""
    tables = [str(t.value) for t in at.table]
    assert len(tables) > 6, "the worked example's tab is open"
    return tables[:6]


def _edited(column: str, value: float) -> dict:
    """A data editor's state after its first row's cell in ``column`` was typed over (as the browser sends it)."""
    return {"edited_rows": {0: {column: value}}, "added_rows": [], "deleted_rows": []}


def test_a_follower_shows_the_presenters_matrices_and_takes_them_back_on_rejoining(room_store):
    """Mechanics: the worked example's matrices the presenter edited are every follower's; a follower who edited
    them while exploring on its own gets the presenter's back with the class (it had kept its own, while the
    rest of the page followed)."""
    presenter = open_app("pages/mechanics.py")
    mine = _open_room(presenter)
    example = _worked_example(presenter)
    presenter.session_state["_mech_X"] = _edited("dim 0", 9.0)
    presenter.run()
    assert not presenter.exception, presenter.exception
    edited = _worked_example(presenter)
    assert edited != example
    follower = open_from_link("app.py", {"follow": mine.code})
    assert not follower.exception, follower.exception
    assert follower.title[0].value == presenter.title[0].value
    assert _worked_example(follower) == edited

    follower.button(key="_follow_detach").click().run()
    follower.session_state["_mech_WQ"] = _edited("q 0", -5.0)
    follower.run()
    assert _worked_example(follower) not in (edited, example), "the follower's own matrices"
    follower.button(key="_follow_rejoin").click().run()
    assert not follower.exception, follower.exception
    assert _worked_example(follower) == edited


def test_a_matrix_a_link_gives_is_numbers_of_the_examples_shape_or_set_aside(room_store):
    """A follower's (or a link's) matrix for the worked example is read as numbers: X in rows of 4 (at most 64
    rows), each W 4 x 3. Anything else gives the example's matrix and one line, never an error."""
    example = _worked_example(open_app("pages/mechanics.py"))
    for link in (
        {
            "mech_x": "1,2,3",
            "mech_wq": "a,b,c;1,0,0;0,0,1;0,1,1",
            "mech_wk": "1e400,0,1;1,1,0;0,1,0;1,1,0",
            "mech_wv": "0,2,0;0,3,0;1,0,3",
        },
        {"mech_x": "1,0,1,0;" * 64 + "1,0,1,0", "mech_wq": ";", "mech_wk": "1,0,1;1,1,0,0;0,1,0;1,1,0"},
    ):
        at = open_from_link("pages/mechanics.py", link)
        assert not at.exception, at.exception
        assert _worked_example(at) == example
        (said,) = [c.value for c in at.caption if "Set aside" in c.value and "mech_" in c.value]
        assert all(key in said for key in link), said
        assert not any(key in at.query_params for key in link), "the example's matrices: out of the address bar"


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("not a code!", "is not a room code"),
        ("K7QX2M", "K7QX2M"),  # well formed, but no room has it
        # trimmed to what is kept of a code: the next run's link must still count as the same room
        (" K7QX2M", "K7QX2M"),
        ("K7QX2M ", "K7QX2M"),
        ("x" * 65, "is not a room code"),
    ],
    ids=["not a code", "no such room", "a space before", "a space after", "65 characters"],
)
def test_a_bad_code_gets_one_line_the_page_works_and_polling_stops(room_store, reads, code, says):
    at = open_from_link("app.py", {"follow": code})
    assert not at.exception, at.exception
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and says in warnings[0], warnings
    assert at.get("plotly_chart"), "the page's own map is still drawn"
    polled = len(reads)
    at.run()  # a poll's time: the same one line, and no read of a room that will never answer
    assert [w.value for w in at.warning] == warnings
    assert len(reads) == polled


def test_an_ended_room_tells_its_followers_and_they_stop_polling(room_store, reads):
    mine = rooms.open_room(_view(""))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert reads, "the follower reads its room"
    rooms.end(mine.code, mine.secret)
    follower.run()
    assert not follower.exception, follower.exception
    assert any("has ended" in w.value for w in follower.warning), [w.value for w in follower.warning]
    polled = len(reads)
    follower.run()
    assert len(reads) == polled


def test_a_presenter_who_ends_the_room_presents_no_more(room_store):
    presenter = open_app()
    mine = _open_room(presenter)
    presenter.sidebar.button(key="_room_end").click().run()
    assert follow.ROOM_STATE not in presenter.session_state
    with pytest.raises(rooms.RoomError, match="has ended"):
        rooms.read(mine.code)


@pytest.mark.parametrize("whose", ["another room", "its own room"])
def test_a_presenting_tab_given_a_rooms_link_keeps_presenting_and_says_where_links_are_followed(room_store, whose):
    """The presenter's tab opened at a room's link: it had followed that room, published the room's views to its own
    class, and hidden its room panel ("End the room" with it)."""
    other = rooms.open_room(_view("explorer", head="3", sentence="another class's sentence"))
    presenter = open_app()
    mine = _open_room(presenter)
    before = rooms.read(mine.code)
    presenter.query_params[follow.FOLLOW] = other.code if whose == "another room" else mine.code
    presenter.run()
    assert not presenter.exception, presenter.exception
    assert follow.FOLLOWING not in presenter.session_state, "it follows no room"
    assert presenter.session_state[follow.ROOM_STATE] == mine, "it presents its room"
    assert [b.key for b in presenter.sidebar.button if b.key == "_room_end"] == ["_room_end"], "its room panel shows"
    assert any(f"This tab presents room {mine.code}" in w.value for w in presenter.sidebar.warning), _texts(presenter)
    assert follow.FOLLOW not in presenter.query_params, "the link's code is let go"
    presenter.run()
    after = rooms.read(mine.code)
    assert (after.version, after.state) == (before.version, before.state), "its class sees what it saw"
    assert "another class's sentence" not in json.dumps(after.state)


def test_a_follower_cannot_drive(room_store):
    """Whatever a follower's page sends (its widgets, a forged pointed cell), the room's view stays the presenter's."""
    mine = rooms.open_room(_view("explorer", head="2"))
    before = rooms.read(mine.code)
    follower = open_from_link("app.py", {"follow": mine.code})
    follower.selectbox(key="head").set_value(4).run()  # the follower's own choice: its page only
    follower.session_state[follow.POINT] = {"chart": "_one_map", "x": "0 x", "y": "0 y"}
    follower.run()
    assert all(b.key != "_room_open" for b in follower.sidebar.button), "a follower opens no room"
    after = rooms.read(mine.code)
    assert (after.version, after.state) == (before.version, before.state)
    with pytest.raises(rooms.RoomError):
        rooms.publish(mine.code, "a guessed secret", {"head": "4"})


def test_the_pointed_cell_reaches_the_followers_map(room_store):
    presenter = open_app()
    mine = _open_room(presenter)
    spec = json.loads(presenter.get("plotly_chart")[0].proto.spec)
    assert [t["type"] for t in spec["data"]] == ["heatmap", "scatter"], "the presenter's map takes a click"
    assert follow.MARK_COLOUR not in json.dumps(spec)
    x, y = spec["data"][0]["x"][1], spec["data"][0]["y"][2]  # the map's second column, third row
    # what a click on that cell leaves (the selection event Streamlit gives the chart's callback)
    presenter.session_state[follow.POINT] = {"chart": "_home_map", "x": x, "y": y}
    presenter.run()
    assert rooms.read(mine.code).state[follow.POINT_KEY] == ["_home_map", x, y]
    follower = open_from_link("app.py", {"follow": mine.code})
    spec = json.loads(follower.get("plotly_chart")[0].proto.spec)
    assert [t["type"] for t in spec["data"]] == ["heatmap"], "a follower's map is not made clickable"
    shapes = spec["layout"].get("shapes", [])
    assert [(s["x0"], s["y0"], s["line"]["color"]) for s in shapes] == [(0.5, 1.5, follow.MARK_COLOUR)]


def test_the_teaching_tab_follows(room_store):
    mine = rooms.open_room(_view("mechanics", mech_tab="Masks"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert not follower.exception, follower.exception
    assert follower.session_state["mech_tab"] == "Masks"
    rooms.publish(mine.code, mine.secret, _view("mechanics", mech_tab="Permutation"))
    follower.run()
    assert not follower.exception, follower.exception
    assert follower.session_state["mech_tab"] == "Permutation"
    assert dict(follower.query_params).get("mech_tab") == "Permutation"


class _Clock:
    """`follow`'s clock, moved by hand: a poll's time without waiting for it."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_a_switch_streamlit_drops_is_applied_again_and_one_that_lands_is_not(room_store, monkeypatch, caplog):
    """Streamlit folds a rerun the browser asks for into a pending st.switch_page, and the browser's page
    wins: the follower stays on the old page (this failed a browser run once). The next poll after
    `follow.RETRY_S` applies the view again, at most `follow.RETRIES` times; a view that is drawn is
    applied once."""
    caplog.set_level(logging.INFO, logger=follow.log.name)
    clock, calls, lose = _Clock(), [], [0]
    monkeypatch.setattr(follow, "time", clock)
    switch = follow.open_link

    def open_link(target, params):
        calls.append(target)
        if lose[0]:
            lose[0] -= 1
            follow.st.rerun()  # the switch is lost: the page reruns as the browser asked, as it was
        switch(target, params)

    monkeypatch.setattr(follow, "open_link", open_link)
    mine = rooms.open_room(_view("explorer", head="2"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert follower.title[0].value == "Attention explorer" and calls == ["pages/explorer.py"]
    for _ in range(2):  # drawn: polls long after apply nothing again
        clock.now += 10 * follow.RETRY_S
        follower.run()
    assert calls == ["pages/explorer.py"]

    lose[0] = 1
    rooms.publish(mine.code, mine.secret, _view("decoding", step="3"))
    follower.run()
    assert follower.title[0].value == "Attention explorer", "the switch was lost"
    clock.now += follow.RETRY_S / 2
    follower.run()
    assert len(calls) == 2, "not again before RETRY_S"
    clock.now += follow.RETRY_S
    follower.run()
    assert not follower.exception, follower.exception
    assert follower.title[0].value == "Decoding, step by step"
    assert dict(follower.query_params) == {"step": "3", "follow": mine.code}
    assert follower.session_state["step"] == 3
    clock.now += 10 * follow.RETRY_S
    follower.run()
    assert calls == ["pages/explorer.py", "pages/decoding.py", "pages/decoding.py"]

    lose[0] = 100  # a page that never takes it: RETRIES tries, one line in the log, then the page is left be
    rooms.publish(mine.code, mine.secret, _view("mechanics", mech_tab="Masks"))
    for _ in range(2 * follow.RETRIES):
        follower.run()
        clock.now += follow.RETRY_S
    assert calls[3:] == ["pages/mechanics.py"] * follow.RETRIES
    assert follower.title[0].value == "Decoding, step by step"
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == follow.log.name]
    again = (logging.INFO, f"room {mine.code}: a follower's page did not draw the room's view; applying it again")
    gave_up = f"room {mine.code}: a follower's page did not take the room's view after {follow.RETRIES} tries"
    # once for the decoding page, then each try after the first for the mechanics page, then one warning
    assert said == [again] + [again] * (follow.RETRIES - 1) + [(logging.WARNING, gave_up)]


def test_a_followers_values_pass_a_links_checks(room_store):
    """A room's value the page cannot take is set aside, as a link's is: the page opens on its default."""
    mine = rooms.open_room(_view("explorer", head="99", layer="2"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert not follower.exception, follower.exception
    assert follower.session_state["layer"] == 2
    assert follower.session_state["head"] != 99
    assert any("head='99'" in c.value for c in follower.caption), [c.value for c in follower.caption]


def test_marked_frames_the_pointed_cell_only_on_its_chart(monkeypatch):
    fig = go.Figure(go.Heatmap(z=np.eye(3), x=["0 a", "1 b", "2 c"], y=["0 x", "1 y", "2 z"]))
    state = {follow.POINT: {"chart": "_one_map", "x": "2 c", "y": "1 y"}}
    monkeypatch.setattr(follow.st, "session_state", state)
    framed = follow.marked(fig, "_one_map")
    (shape,) = framed.layout.shapes
    assert (shape.x0, shape.x1, shape.y0, shape.y1) == (1.5, 2.5, 0.5, 1.5)  # column 2, row 1
    assert not fig.layout.shapes  # the shared figure is not changed
    assert follow.marked(fig, "_home_map") is fig
    state[follow.POINT] = {"chart": "_one_map", "x": "9 q", "y": "1 y"}  # a label the map does not have
    assert follow.marked(fig, "_one_map") is fig


def test_clickable_gives_every_click_inside_a_cell_that_cell():
    """Plotly selects the point nearest a click (``hoverdistance=-1``: however far): the invisible points sit
    one on each cell's centre, with the cell's labels and weight, so a click anywhere inside a cell selects it."""
    rng = np.random.default_rng(0)
    xs, ys = ["0 a", "1 b", "2 a", "3 c"], ["0 x", "1 y", "2 x"]  # a map's labels: position-prefixed
    z = rng.random((len(ys), len(xs)))
    fig = follow.clickable(go.Figure(go.Heatmap(z=z, x=xs, y=ys)))
    heat, cells = fig.data
    assert heat.type == "heatmap" and cells.type == "scatter"
    assert fig.layout.hoverdistance == -1 and fig.layout.clickmode == "event+select"
    assert cells.marker.opacity == 0 and cells.selected.marker.opacity == 0
    # the points as plotly places them on categorical axes: a label's position is its index
    centres = np.array([(xs.index(x), ys.index(y)) for x, y in zip(cells.x, cells.y, strict=True)])
    for _ in range(500):
        col, row = rng.integers(len(xs)), rng.integers(len(ys))
        click = np.array([col, row]) + rng.uniform(-0.499, 0.499, 2)  # anywhere inside the cell
        nearest = int(np.argmin(((centres - click) ** 2).sum(axis=1)))
        assert (cells.x[nearest], cells.y[nearest]) == (xs[col], ys[row])
        assert cells.customdata[nearest] == pytest.approx(z[row, col])
    assert len(cells.x) == z.size, "one point a cell"
    image = go.Figure(go.Image(z=np.zeros((2, 2, 3))))
    assert follow.clickable(image) is image, "a map drawn as an image (a long text) is left as it is"


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_a_redis_that_goes_away_tells_followers_and_the_presenter_keeps_presenting(monkeypatch, tmp_path):
    """Rooms in a real Redis (ATTNVIZ_ROOMS_URL): it hangs, comes back, then goes away for good."""
    import signal

    from rooms_servers import RedisServer

    server = RedisServer(tmp_path / "redis")
    try:
        monkeypatch.setenv("ATTNVIZ_ROOMS_URL", server.url)
        monkeypatch.setenv("ATTNVIZ_ROOM_PUBLISHES_PER_S", "1000000")
        presenter = open_app("pages/explorer.py")
        mine = _open_room(presenter)
        follower = open_from_link("app.py", {"follow": mine.code})
        assert follower.title[0].value == "Attention explorer"

        def lost() -> None:
            follower.run()  # a poll: one clear line, and the page the follower has
            assert not follower.exception, follower.exception
            assert [w.value for w in follower.warning if rooms.room.UNAVAILABLE in w.value], _texts(follower)
            assert follower.get("plotly_chart"), "the follower's page still shows its map"
            presenter.selectbox(key="head").set_value(head).run()  # the presenter goes on
            assert not presenter.exception, presenter.exception
            assert any("Your screen keeps presenting" in w.value for w in presenter.warning), _texts(presenter)
            assert presenter.session_state[follow.ROOM_STATE] == mine, "the presenter still holds the room"

        server.proc.send_signal(signal.SIGSTOP)  # the store stops answering, its connections open
        head = 2
        lost()
        # the change made while it hung is kept and sent again (it had been dropped, and an older one held back
        # could land after it): the room panel says so until a write takes it
        assert rooms.unwritten(mine.code) == rooms.room.UNWRITTEN
        server.proc.send_signal(signal.SIGCONT)  # it answers again: the presenter's next change reaches the class
        presenter.selectbox(key="head").set_value(3).run()
        assert rooms.unwritten(mine.code) is None, "the change written takes the place of the one kept"
        presenter.run()  # the panel's line was drawn before the run's change was written: its next refresh
        assert not presenter.warning, _texts(presenter)
        follower.run()
        assert not follower.warning and follower.session_state["head"] == 3, _texts(follower)

        server.stop()  # and goes away for good
        head = 4
        lost()
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.stop()


class _HeldStore:
    """The rooms' store, with a clock the test moves (``now``) and writes that fail while ``failing`` (``failed``
    counts them)."""

    def __init__(self, store):
        self._store, self.now = store, time.time()
        self.failing, self.failed = False, 0

    def clock(self) -> float:
        return self.now

    def put(self, *args, **kwargs):
        if self.failing:
            self.failed += 1
            raise StoreError("the rooms' Redis does not answer: Timeout reading from socket")
        return self._store.put(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def _eventually(condition, seconds: float = 5.0) -> None:
    """Wait until ``condition()`` holds (a timer's work, in another thread); the test fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.01)


def test_a_coalesced_change_the_store_fails_to_take_is_sent_again_and_the_presenter_is_told(room_store, monkeypatch):
    """A change the rooms coalesce is written by a timer after the presenter's run, which had counted it as
    published: when the store fails just then, the presenter's room panel says the change has not reached the
    class, and the change reaches it when the store answers (it had been lost until the presenter's next one)."""
    monkeypatch.setenv("ATTNVIZ_ROOM_PUBLISHES_PER_S", "10")
    held = _HeldStore(rooms.ROOMS._store())
    monkeypatch.setattr(rooms.ROOMS, "_store", lambda: held)
    presenter = open_app("pages/explorer.py")
    mine = _open_room(presenter)
    held.failing = True
    presenter.selectbox(key="head").set_value(3).run()  # within the interval: coalesced, written by a timer
    assert not presenter.warning, _texts(presenter)
    held.now += 1
    _eventually(lambda: held.failed >= 1)
    presenter.run()
    assert any("has not reached the class yet" in w.value for w in presenter.sidebar.warning), _texts(presenter)
    held.failing = False
    _eventually(lambda: rooms.read(mine.code).state.get("head") == "3")
    presenter.run()
    assert not presenter.warning, _texts(presenter)


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_a_run_replaced_before_its_end_leaves_the_view_pending_and_the_next_poll_applies_it(room_store, monkeypatch):
    """A run that starts with the room's view can be replaced before its end by a rerun the browser asks for,
    carrying the old page and its values: the view is not drawn until a run that started with it ends (a fresh
    clone's browser run once left a follower a step behind its presenter for 60 s). The next poll after
    `follow.RETRY_S` applies it again; a view drawn to its end is not applied again."""
    clock, replaced, calls = _Clock(), [0], []
    monkeypatch.setattr(follow, "time", clock)
    mine = rooms.open_room(_view("explorer", head="2"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert follower.title[0].value == "Attention explorer"
    publish, switch = follow.publish_view, follow.open_link

    def publish_view():  # at the end of the frame, before `follow.drawn`
        if replaced[0] and follow.st.session_state.get(follow.PAGE_NOW) == "decoding":
            replaced[0] -= 1  # the browser's rerun of the old page and its values wins, before this run's end
            switch("pages/explorer.py", {"head": ["2"], "follow": [mine.code]})
        publish()

    def open_link(target, params):
        calls.append(target)
        switch(target, params)

    monkeypatch.setattr(follow, "publish_view", publish_view)
    monkeypatch.setattr(follow, "open_link", open_link)
    replaced[0] = 1
    rooms.publish(mine.code, mine.secret, _view("decoding", step="3"))
    follower.run()
    assert not replaced[0] and calls == ["pages/decoding.py"], "the decoding page's run started, then was replaced"
    assert follower.title[0].value == "Attention explorer", "the old page won"
    clock.now += follow.RETRY_S / 2
    follower.run()
    assert calls == ["pages/decoding.py"], "not again before RETRY_S"
    clock.now += follow.RETRY_S
    follower.run()
    assert not follower.exception, follower.exception
    assert follower.title[0].value == "Decoding, step by step"
    assert dict(follower.query_params) == {"step": "3", "follow": mine.code}
    clock.now += 10 * follow.RETRY_S
    follower.run()
    assert calls == ["pages/decoding.py"] * 2, "drawn to its end: applied no more"


@pytest.fixture
def switches(monkeypatch) -> list[str]:
    """The page of every switch `follow.open_link` makes, in order (the switch itself goes ahead)."""
    seen, switch = [], follow.open_link

    def open_link(target, params):
        seen.append(target)
        switch(target, params)

    monkeypatch.setattr(follow, "open_link", open_link)
    return seen


@contextlib.contextmanager
def _fragment_run(at, fragment: str, pages: list):
    """The AppTest's next run is the fragment named ``fragment`` alone, as its timer starts it in a browser
    (AppTest runs the whole page otherwise): the run's request names the fragment, as Streamlit's does, and
    the run keeps the pages the last whole run registered (``pages``: `recorded_pages`), as a server's session
    does (AppTest makes them anew for each run, and a fragment's run alone registers none). Streamlit 1.67's
    internals; the test below fails if they change."""
    from streamlit.testing.v1 import app_test, local_script_runner

    store = at._fragment_storage._fragments  # MemoryFragmentStorage, by fragment id
    names = {i: [getattr(c.cell_contents, "__name__", "") for c in f.__closure__ or ()] for i, f in store.items()}
    ids = [i for i, held in names.items() if fragment in held]  # the function each wrapper holds
    assert len(ids) == 1, f"the fragment {fragment!r} among {store!r}"
    whole, made = local_script_runner.RerunData, app_test.PagesManager
    local_script_runner.RerunData = functools.partial(whole, fragment_id_queue=ids, is_fragment_scoped_rerun=True)
    app_test.PagesManager = lambda *args, **kwargs: pages[-1]
    try:
        yield
    finally:
        local_script_runner.RerunData, app_test.PagesManager = whole, made


@pytest.fixture
def recorded_pages(monkeypatch) -> list:
    """Every PagesManager the AppTests of a test make, in order (the pages each run registered)."""
    from streamlit.testing.v1 import app_test

    made, pages = app_test.PagesManager, []
    monkeypatch.setattr(
        app_test, "PagesManager", lambda *args, **kwargs: pages.append(made(*args, **kwargs)) or pages[-1]
    )
    return pages


def test_a_view_a_stopped_run_left_undrawn_is_applied_again_by_the_next_poll(
    room_store, monkeypatch, recorded_pages, switches
):
    """A whole run that starts with the room's view and stops before its end leaves the view pending and
    marked as being drawn (`follow.DRAWING`); the polls that follow are the fragment's runs alone, and in
    those the mark is stale: after `follow.RETRY_S` the view is applied again (a fresh clone's browser run
    once left a follower on a blank page for 60 s, its polls going on, nothing in the log)."""
    clock, calls, stopped = _Clock(), switches, [0]
    monkeypatch.setattr(follow, "time", clock)
    drawn = follow.drawn

    def drawn_unless_stopped():  # the run stopped before its end: `drawn` never came
        if stopped[0]:
            stopped[0] -= 1
            return
        drawn()

    whole, runs = follow._whole_run, []  # what each poll found the run to be (streamlit's run context)
    monkeypatch.setattr(follow, "_whole_run", lambda: runs.append(whole()) or runs[-1])
    monkeypatch.setattr(follow, "drawn", drawn_unless_stopped)
    mine = rooms.open_room(_view("explorer", head="2"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert follower.title[0].value == "Attention explorer" and calls == ["pages/explorer.py"]

    stopped[0] = 1
    rooms.publish(mine.code, mine.secret, _view("decoding", step="3"))
    follower.run()
    assert calls == ["pages/explorer.py", "pages/decoding.py"] and not stopped[0]
    assert runs and all(runs), "whole runs"
    pending = follower.session_state[follow.FOLLOWING]["pending"]
    assert follower.session_state[follow.DRAWING] == pending, "left by the run that stopped"
    clock.now += follow.RETRY_S / 2
    with _fragment_run(follower, "_poll", recorded_pages):
        follower.run()
    assert len(calls) == 2, "not again before RETRY_S"
    assert runs[-1] is False, "a fragment's run is told from a whole page's"
    clock.now += follow.RETRY_S
    with _fragment_run(follower, "_poll", recorded_pages):
        follower.run()
    assert not follower.exception, follower.exception
    assert calls[2:] == ["pages/decoding.py"], "applied again: the mark was the stopped run's"
    assert follower.title[0].value == "Decoding, step by step"
    assert "pending" not in follower.session_state[follow.FOLLOWING], "drawn to its end this time"


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_a_session_moved_off_the_rooms_page_by_a_fragments_run_is_taken_back(room_store, monkeypatch, caplog, switches):
    """Streamlit runs a fragment's rerun on the page the browser asked from, and a follower's browser can ask
    from the page before a switch reached it: the session is then on the old page though its last whole
    run drew the room's (a fresh clone's browser run once kept a follower off the room's page for 60 s).
    The next poll takes it back at once. A follower who opens another page itself (a whole run) stays there."""
    caplog.set_level(logging.INFO, logger=follow.log.name)
    clock, calls, stale = _Clock(), switches, [0]
    monkeypatch.setattr(follow, "time", clock)
    start = links.start

    def start_of():  # a fragment's run on another page draws no whole page: the last whole run's hash stays
        kept = links.st.session_state.get(links.PAGE_STATE)
        start()
        if stale[0]:
            stale[0] -= 1
            links.st.session_state[links.PAGE_STATE] = kept

    monkeypatch.setattr(links, "start", start_of)
    mine = rooms.open_room(_view("decoding", step="2"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert follower.title[0].value == "Decoding, step by step" and calls == ["pages/decoding.py"]

    stale[0] = 1
    follower.switch_page("pages/explorer.py").run()  # the session on the page before, as a stale request leaves it
    assert not follower.exception, follower.exception
    assert calls == ["pages/decoding.py"] * 2, "taken back at once, without waiting for RETRY_S"
    assert follower.title[0].value == "Decoding, step by step"
    assert (follower.query_params["step"], follower.query_params["follow"]) == ("2", mine.code)
    said = [r.getMessage() for r in caplog.records if r.name == follow.log.name]
    assert said == [f"room {mine.code}: a follower's page left it; applying it again"]

    follower.switch_page("pages/explorer.py").run()  # the follower's own whole run on another page
    for _ in range(2):
        clock.now += 10 * follow.RETRY_S
        follower.run()
    assert follower.title[0].value == "Attention explorer" and calls == ["pages/decoding.py"] * 2


def test_a_follow_links_text_is_shown_as_text_never_as_markdown(room_store, reads):
    """A crafted code had been drawn as a link (or an image fetched from elsewhere) in the follower's warning."""
    for code in ("[Log in again](https://ev.il)", "![x](https://ev.il/x.png)", "**ABC** :red[X]"):
        at = open_from_link("app.py", {"follow": code})
        assert not at.exception, at.exception
        (warning,) = [w.value for w in at.warning]
        assert code not in warning and "\\" in warning, warning  # its markdown characters escaped


def test_a_presenter_whose_address_bar_has_a_foreign_parameter_still_opens_and_publishes(room_store):
    """?utm-source=mail (a mail's tracking) or ?Ref=x is no parameter of the app: left out of the view, not a
    reason to refuse the whole room."""
    presenter = open_from_link("pages/explorer.py", {"utm-source": "mail", "Ref": "x"})
    mine = _open_room(presenter)
    state = rooms.read(mine.code).state
    assert "utm-source" not in state and "Ref" not in state and state[follow.PAGE_KEY] == "explorer", state
    presenter.selectbox(key="head").set_value(3).run()
    assert rooms.read(mine.code).state.get("head") == "3"


def test_a_view_naming_streamlits_embed_parameters_is_followed_without_them(room_store):
    """A view that names ?embed or ?embed_options (a forged one: no presenter's address bar lists them) had raised
    StreamlitAPIException in st.switch_page, a traceback on every follower's page; they are set aside, as a
    screen's own parameters are, and the rest of the view is followed."""
    mine = rooms.open_room(_view("explorer", embed="true", embed_options="dark_theme", head="2"))
    follower = open_from_link("app.py", {"follow": mine.code})
    assert not follower.exception, follower.exception
    assert follower.title[0].value == "Attention explorer" and follower.session_state["head"] == 2
    assert "embed" not in follower.query_params and "embed_options" not in follower.query_params


def test_a_room_whose_record_is_not_a_rooms_tells_its_followers_once_and_they_stop_polling(room_store, reads, caplog):
    """A record damaged in the store will not mend itself: its followers had read it twice a second for as long
    as their tabs stayed open, each read an ERROR line in the server's log."""
    mine = rooms.open_room(_view(""))
    follower = open_from_link("app.py", {"follow": mine.code})
    store = rooms.ROOMS._store()
    key = f"room:{mine.code}"
    revision, _ = store.get(key)
    store.put(key, "{not json", 3600, expect=revision)
    with caplog.at_level(logging.ERROR, logger="attnviz.app.rooms.room"):
        follower.run()
        assert not follower.exception, follower.exception
        warnings = [w.value for w in follower.warning]
        assert len(warnings) == 1 and "cannot be read on this server" in warnings[0], warnings
        polled = len(reads)
        follower.run()
        follower.run()
    assert len(reads) == polled, "no more reads of a room that cannot be read"
    assert [w.value for w in follower.warning] == warnings
    assert len([r for r in caplog.records if "not a room's" in r.getMessage()]) == 1
