"""A live training in a real browser: started from "How attention forms", stopped when its tab closes.

A person presses "Train a small model now" and closes the tab: the run loses its heartbeat (the
page's fragment no longer reruns), so the server stops it within its ATTNVIZ_LIVE_LEFT_AFTER_SECONDS and a little more,
deletes its temporary folder and frees the slot, which a second tab then takes. Headless Debian
chromium via playwright; the server and browser set-up are test_browser.py's, the page's history
tests/formation_histories.py's (the page shows its section under a model's history).
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlencode

import pytest
from browser_wait import settled, still
from formation_histories import write_history
from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _need_browser, running_app

from attnviz.app import CUSTOM_PATH
from attnviz.checkpoints.catalog import pretrained_dir

pytestmark = pytest.mark.slow  # a server, a browser and a training

BUTTON = "[data-testid='stMain'] button:has-text('Train a small model now')"
MINE = "[data-testid='stMain'] :text('Your model')"
REFUSED = "[data-testid='stMain'] :text('A class model is training on this server already')"
LEFT_AFTER_S = 3  # the server's ATTNVIZ_LIVE_LEFT_AFTER_SECONDS (see `server`)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    _need_browser()
    models = tmp_path_factory.mktemp("live-models")
    write_history("reverse", models, name="reverse-history")
    temporary = tmp_path_factory.mktemp("live-tmp")
    env = {
        **os.environ,
        "ATTNVIZ_MODEL_ROOTS": os.pathsep.join([str(pretrained_dir()), str(models)]),
        "ATTNVIZ_LIVE_TRAINING_CPU_SECONDS": "600",  # it must still run when the tab closes
        # A closed tab's run is stopped after LEFT_AFTER_S of silence, not the default 10: the training spends a
        # core for as long as the test waits, twice (a tab still open is not stopped for silence alone: 2 minutes).
        "ATTNVIZ_LIVE_LEFT_AFTER_SECONDS": str(LEFT_AFTER_S),
        "TMPDIR": str(temporary),
    }
    with running_app(env) as url:
        yield url, temporary


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def live_folders(temporary) -> list[str]:
    return sorted(p.name for p in temporary.glob("attnviz-live-*"))


def start_training(browser, url: str):
    page = still(browser.new_context(viewport={"width": 1400, "height": 1000})).new_page()
    page.goto(url)
    settled(page, url)
    assert page.locator("[data-testid='stException']").count() == 0
    page.locator(BUTTON).click()
    page.wait_for_selector(f"{MINE}, {REFUSED}", timeout=120_000)
    return page


def wait_until(condition, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - start


def test_closing_the_tab_stops_the_training_deletes_its_folder_and_frees_the_slot(server, browser):
    url, temporary = server
    link = f"{url}/formation?" + urlencode({"model": CUSTOM_PATH, "model_path": "reverse-history"})
    first = start_training(browser, link)
    assert first.locator(MINE).count() > 0, "the first visitor's training started"
    (folder,) = live_folders(temporary)

    other = still(browser.new_context(viewport={"width": 1400, "height": 1000})).new_page()
    other.goto(link)
    settled(other, "a second visitor")
    other.locator(BUTTON).click()
    try:
        other.wait_for_selector(REFUSED, timeout=180_000)  # one at a time: told, and shown the class's model
    except Exception:
        other.screenshot(path=str(ARTIFACTS / "live-training-second-visitor-failed.png"))
        raise
    other.context.close()

    assert live_folders(temporary) == [folder], "the first run still trains while its tab is open"
    first.context.close()  # the tab closes: its fragment no longer beats, its websocket is gone
    wait_until(lambda: folder not in live_folders(temporary), LEFT_AFTER_S + 60, "the run stopped")

    again = start_training(browser, link)  # the slot is free: a new visitor trains
    try:
        assert again.locator(MINE).count() > 0 and again.locator(REFUSED).count() == 0
        assert len(live_folders(temporary)) == 1
    finally:
        again.context.close()
    wait_until(lambda: live_folders(temporary) == [], LEFT_AFTER_S + 60, "the second run stopped")
