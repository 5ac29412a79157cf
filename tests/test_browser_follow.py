"""Follow the teacher (issue 34) as people do it, in chromium: a presenter and a follower, two browser contexts.

The presenter opens a room, the follower opens its link; the presenter steps through decoding and
the walkthrough and points at a cell, and the follower's page shows each (waited for up to `BOUND_S`;
the issue's 1 s is measured by `benchmarks/bench_class.py --follow`, not here: a timed bound of 3 s
failed once with the cores busier than the suite makes them); the follower explores on its own and comes
back; a forged "drive" from the follower's page, and a tab that forges a kept room, change nothing in
the room; the presenter's reload keeps presenting it. One server, its rooms in a SQLite store of the
test's own (test_rooms.py checks the stores themselves, across processes); then two servers, as two
replicas, sharing one store: the presenter on one, the follower on the other, each replica killed and
restarted in turn.
"""

from __future__ import annotations

import contextlib
import os
import re
import time

import pytest
from browser_wait import settled, still
from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _need_browser, running_app

from attnviz.app import rooms

pytestmark = pytest.mark.slow  # a server and two browsers: about a minute

# How long the test waits for a follower to show a change (its speed is bench_class --follow's to measure).
# 20 s ran out in two runs with two other processes spinning (AVX2-only EPYC), right after a replica was
# killed and started again; with 60 s the same run passed.
BOUND_S = 60.0
VIEWPORT = {"width": 1400, "height": 1000}
APP = "[data-testid='stApp']"
CONNECTED = f"{APP}[data-test-connection-state='CONNECTED']"  # the page's websocket is up
MARKED = """() => [...document.querySelectorAll('.js-plotly-plot .shapelayer path')]
    .some(p => (p.style.stroke || '').replace(/\\s/g, '') === 'rgb(255,0,170)')"""
SHOWN = {  # where a page shows a widget's value, by the widget's key
    "step": "[data-testid='stMain'] .st-key-step [data-testid='stSliderThumbValue']",
    "wt_stage": "[data-testid='stMain'] .st-key-wt_stage [data-testid='stSelectbox'] input",
    "head": "[data-testid='stMain'] .st-key-head [data-testid='stSelectbox'] input",
}


@pytest.fixture(scope="module")
def room_server(tmp_path_factory):
    _need_browser()
    folder = tmp_path_factory.mktemp("rooms")
    env = {**os.environ, "ATTNVIZ_ROOMS_DIR": str(folder)}
    env.pop("ATTNVIZ_ROOMS_URL", None)
    with running_app(env) as url:
        yield url, folder


def _arrives(page, what: str, check) -> float:
    """Seconds until ``check(page)`` holds on the follower's page; fails after `BOUND_S`."""
    start = time.perf_counter()
    while True:
        if check(page):
            return time.perf_counter() - start
        if time.perf_counter() - start > BOUND_S:
            page.screenshot(path=str(ARTIFACTS / "follow-missed.png"))
            raise AssertionError(f"the follower did not show {what} within {BOUND_S} s; it is at {page.url}")
        page.wait_for_timeout(50)


def _shown(page, key: str) -> str | None:
    """The value the page shows for the widget ``key`` (None when it has no such widget)."""
    found = page.locator(SHOWN[key]).first
    if not found.count():
        return None
    return (found.input_value() if SHOWN[key].endswith("input") else found.inner_text()).strip()


def _param(url: str, key: str) -> list[str]:
    from urllib.parse import parse_qs, urlsplit

    return parse_qs(urlsplit(url).query).get(key, [])


def _same(teacher, key: str):
    """A check that a follower's page shows the teacher's value of ``key``, and its address bar holds it."""
    wanted, link = _shown(teacher, key), _param(teacher.url, key)
    assert wanted, f"the presenter's page shows its {key}"

    def check(student) -> bool:
        return _shown(student, key) == wanted and _param(student.url, key) == link

    return wanted, check


def test_a_follower_follows_the_presenter_live(room_server, monkeypatch):
    from playwright.sync_api import sync_playwright

    url, folder = room_server
    monkeypatch.setenv("ATTNVIZ_ROOMS_DIR", str(folder))  # this process reads the server's rooms
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            teacher = still(browser.new_context(viewport=VIEWPORT)).new_page()
            teacher.goto(f"{url}/decoding")
            settled(teacher, "the presenter's decoding page")
            teacher.get_by_role("button", name="Open a room").click()
            code = _room_code(teacher)
            settled(teacher, "the presenter's open room")  # the code is drawn before the link and the QR under it
            link = teacher.locator("[data-testid='stSidebar'] [data-testid='stCode']").inner_text().strip()
            assert link.endswith(f"/?follow={code}"), link
            assert teacher.locator("[data-testid='stSidebar'] [data-testid='stImage'] img").count() == 1  # the QR

            student_context = still(browser.new_context(viewport=VIEWPORT))
            student = student_context.new_page()
            student.goto(f"{url}/?follow={code}")  # the link opens the home page: the room takes it to decoding
            student.get_by_text(f"Following room {code}").wait_for(timeout=60_000)
            _arrives(
                student, "the room's page", lambda s: s.get_by_role("heading", name="Decoding, step by step").count()
            )
            settled(student, "the follower's first view", idle=False)
            teacher.get_by_text("1 screen following").wait_for(timeout=10_000)  # counted within its refresh

            seen = []
            for _ in range(2):  # the presenter steps through decoding
                teacher.locator(".st-key-_step_next button").first.click()
                settled(teacher, "the presenter's step")
                wanted, same = _same(teacher, "step")  # on the page and in the address bar: a link to copy
                seen.append(_arrives(student, f"step {wanted}", same))
                assert _param(student.url, "follow") == [code], student.url

            teacher.locator("[data-testid='stSidebar']").get_by_role("link", name="Forward-pass walkthrough").click()
            settled(teacher, "the presenter's walkthrough")
            seen.append(
                _arrives(student, "the walkthrough", lambda s: s.get_by_role("heading", name="Forward-pass").count())
            )
            settled(student, "the follower's walkthrough", idle=False)
            for _ in range(2):  # and through the walkthrough's stages
                teacher.locator(".st-key-_wt_next button").first.click()
                settled(teacher, "the presenter's stage")
                wanted, same = _same(teacher, "wt_stage")
                seen.append(_arrives(student, f"stage {wanted}", same))

            teacher.locator("[data-testid='stSidebar']").get_by_role("link", name="Attention explorer").click()
            settled(teacher, "the presenter's explorer")
            settled(student, "the follower's explorer", idle=False)
            plot = teacher.locator("[data-testid='stMain'] .js-plotly-plot .nsewdrag").first
            box = plot.bounding_box()
            teacher.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.3)  # points at a cell
            settled(teacher, "the presenter's pointed cell")
            assert teacher.evaluate(MARKED), "the presenter's map frames the cell pointed at"
            seen.append(_arrives(student, "the pointed cell", lambda s: s.evaluate(MARKED)))

            # Explore on my own: the presenter's next change does not move the follower
            student.get_by_role("button", name="Explore on my own").click()
            student.get_by_role("button", name="Back to the class").wait_for(timeout=30_000)
            settled(student, "the follower, detached")
            before_head = _shown(student, "head")
            teacher.locator("[data-testid='stMain'] .st-key-head").get_by_role("button", name="Open").click()
            teacher.get_by_role("option", name="1" if before_head != "1" else "2", exact=True).click()
            settled(teacher, "the presenter's other head")
            wanted, same = _same(teacher, "head")
            assert wanted != before_head
            student.wait_for_timeout(1500)
            assert _shown(student, "head") == before_head, "a detached follower keeps its view"
            student.get_by_role("button", name="Back to the class").click()
            seen.append(_arrives(student, "the rejoin", same))

            # A follower that drives: its page has no room panel, and its own choices stay its own
            before = rooms.read(code)
            student.get_by_role("button", name="Explore on my own").click()
            student.get_by_role("button", name="Back to the class").wait_for(timeout=30_000)
            settled(student, "the follower, detached again")  # a list opened during that run would close
            student.locator("[data-testid='stMain'] .st-key-head").get_by_role("button", name="Open").click()
            student.get_by_role("option").last.click()
            settled(student, "the follower's own change")
            assert student.get_by_role("button", name="Open a room").count() == 0
            after = rooms.read(code)
            assert (after.version, after.state) == (before.version, before.state)

            # A tab that forges the room it kept (a guessed secret) presents nothing, and forgets it
            forger = student_context.new_page()
            forger.goto(url)
            settled(forger, "a visitor's home page")
            forger.evaluate(
                f"sessionStorage.setItem('attnviz.room', JSON.stringify({{code: '{code}', secret: 'guess'}}))"
            )
            forger.reload()
            settled(forger, "the forger's page")
            forger.wait_for_function("sessionStorage.getItem('attnviz.room') === null", timeout=30_000)
            forger.get_by_role("button", name="Open a room").wait_for(timeout=30_000)  # it offers a room of its own
            settled(forger, "the forger's page, its room forgotten")
            assert forger.get_by_role("button", name="Open a room").count() == 1
            after = rooms.read(code)
            assert (after.version, after.state) == (before.version, before.state)

            # The presenter's tab reloads (a slip of a finger): it presents the same room again
            teacher.reload()
            settled(teacher, "the presenter's page, reloaded")
            assert _room_code(teacher) == code
            # ... and so it does when it is given the room's link: it asks its tab, as any new session, and presents
            # again, with a line that says where a link is followed (it had forgotten its room, which no one could
            # then end, and followed it)
            teacher.goto(link)
            teacher.get_by_text(f"This tab presents room {code}").wait_for(timeout=60_000)
            settled(teacher, "the presenter's tab at the room's link")
            assert _room_code(teacher) == code
            assert teacher.get_by_text(f"Following room {code}").count() == 0
            assert teacher.get_by_role("button", name="End the room").count() == 1
            for page in (teacher, student, forger):
                assert page.locator("[data-testid='stException']").count() == 0
            print(f"follower caught up in {', '.join(f'{s * 1000:.0f}' for s in seen)} ms")
        finally:
            browser.close()


def test_replicas_share_rooms_and_a_killed_one_loses_none(tmp_path, monkeypatch):
    """Two servers (replicas) share one SQLite store: the presenter on one, a follower on the other. Each
    replica in turn is killed (SIGKILL, by its PID) and started again on its port: the presenter's page
    resumes its room, the follower's follows again, and the room goes on."""
    from playwright.sync_api import sync_playwright

    _need_browser()
    # One cookie secret for every start, as deploy/serve.sh gives its replicas: a page's XSRF cookie,
    # signed by the first start, must pass at the next, or its websocket is refused for good.
    env = {**os.environ, "ATTNVIZ_ROOMS_DIR": str(tmp_path / "rooms"), "STREAMLIT_SERVER_COOKIE_SECRET": "t" * 64}
    env.pop("ATTNVIZ_ROOMS_URL", None)
    monkeypatch.setenv("ATTNVIZ_ROOMS_DIR", env["ATTNVIZ_ROOMS_DIR"])  # this process reads the servers' rooms
    monkeypatch.delenv("ATTNVIZ_ROOMS_URL", raising=False)
    servers: list = []
    with running_app(env, procs=servers) as one, running_app(env, procs=servers) as other, sync_playwright() as p:
        assert one != other
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            teacher = still(browser.new_context(viewport=VIEWPORT)).new_page()
            teacher.goto(f"{one}/decoding")
            settled(teacher, "the presenter's decoding page")
            teacher.get_by_role("button", name="Open a room").click()
            code = _room_code(teacher)
            student = still(browser.new_context(viewport=VIEWPORT)).new_page()
            student.goto(f"{other}/?follow={code}")
            _arrives(
                student, "the room's page", lambda s: s.get_by_role("heading", name="Decoding, step by step").count()
            )
            settled(student, "the follower's first view")  # a fresh replica's first run: its model loads

            def step(what: str) -> None:
                teacher.locator(".st-key-_step_next button").first.click()
                settled(teacher, "the presenter's step")
                wanted, same = _same(teacher, "step")
                _arrives(student, f"step {wanted} {what}", same)
                assert _param(student.url, "follow") == [code]

            step("from the other replica")
            with contextlib.ExitStack() as restarted:
                for server, url, page, who in (
                    (servers[0], one, teacher, "presenter"),
                    (servers[1], other, student, "follower"),
                ):
                    version = rooms.read(code).version
                    server.kill()  # no goodbye to the browsers: a crash, or a replica the operator restarts
                    server.wait(timeout=20)
                    page.wait_for_selector(f"{APP}:not({CONNECTED})", timeout=30_000)  # its page sees it go
                    restarted.enter_context(running_app(env, port=int(url.rsplit(":", 1)[1])))
                    page.wait_for_selector(CONNECTED, timeout=90_000)  # and comes back: a new session of the replica
                    settled(teacher, f"the presenter, back after the {who}'s replica")
                    assert _room_code(teacher) == code, f"the presenter resumes the room after the {who}'s replica"
                    student.get_by_text(f"Following room {code}").wait_for(timeout=60_000)
                    settled(student, f"the follower, back after the {who}'s replica")  # a fresh start's first run
                    assert rooms.read(code).version >= version, "the room is still there"
                    step(f"after the {who}'s replica was killed")
                    for shown in (teacher, student):
                        assert shown.locator("[data-testid='stException']").count() == 0
        finally:
            browser.close()


def _room_code(teacher) -> str:
    """The code of the room the presenter's sidebar shows (waits for it)."""
    room = teacher.locator("[data-testid='stSidebar']").get_by_text(re.compile(r"^Room [A-Z0-9]{6}$"))
    room.wait_for(timeout=60_000)
    return room.inner_text().split()[-1]
