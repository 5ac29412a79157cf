"""A real browser opens every page of the running app (headless Debian chromium via playwright).

Screenshots land in test-artifacts/. Locally the test skips when chromium or playwright is
missing; under CI (CI=true) a missing browser is a failure, so the check cannot silently vanish.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import presenter_checks
import pytest
from browser_wait import RUN_ENDS_S, resized, settled

from attnviz import api
from attnviz.app import CUSTOM_PATH, registry
from attnviz.checkpoints.catalog import pretrained_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_render import ZOOM_TITLE, build_random_lm, build_random_model, drag_box, letters  # noqa: E402

pytestmark = pytest.mark.slow  # servers and browsers: the full suite, not the quick tier

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
# screenshot name -> address, for every page in the app's registry
PAGES = {page.url_path or "home": page.url_path for page in registry.PAGES}
CHROMIUM_ARGS = [  # this machine's network is closed: no background connections, no sandbox as root
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found: apt-get install -y chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright not installed: pip install -e '.[test]'"
    return None


LONG = 1000  # source tokens of the long input: beyond every shipped model, so a random model allows it
# A language model's prompt whose maps (2 layers x 4 heads x 3000^2 floats, 288 MB) are over the
# default ATTNVIZ_FULL_MAPS_MB (256): the explorer shows it tile by tile.
LONG_LM = 3000
LM_FAMILIES = ("gpt2", "llama", "qwen2")


@contextlib.contextmanager
def running_app(env: dict, port: int | None = None, procs: list | None = None):
    """A fresh ``streamlit run app.py`` on 127.0.0.1, its address while it runs; stopped by its PID.

    ``port``: the port to listen on (a free one by default); ``procs``: a list that gets the server's
    process, for a test that kills it while it serves.
    """
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    ARTIFACTS.mkdir(exist_ok=True)
    # The server's log goes to a file: a pipe nobody reads fills up, and the server then blocks
    # writing to it (seen: it no longer stopped within 20 s once a page logged more).
    log = open(ARTIFACTS / f"streamlit-{port}.log", "wb")  # closed when the server stops
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.headless",
            "true",
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.fileWatcherType",  # nothing to reload in a test; watching .venv/ overflows inotify
            "none",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    if procs is not None:
        procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("streamlit did not start") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _need_browser() -> None:
    reason = _missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the browser test must run in CI: {reason}")
        pytest.skip(reason)


@contextlib.contextmanager
def serving_test_models(tmp_path_factory):
    """An app server on the shipped models and this module's random ones (long, long-lm, one folder per
    language-model family): its address while it runs."""
    _need_browser()
    models = tmp_path_factory.mktemp("models")
    build_random_model(models / "long", max_len=LONG + 100)
    build_random_lm(models / "long-lm", max_len=LONG_LM)  # a prompt whose maps are shown tile by tile
    try:
        from lm_models import build

        for family in LM_FAMILIES:  # Llama: RoPE and grouped-query attention; Qwen2: Q/K/V biases
            build(family, models / family)
    except ImportError:  # transformers missing: the language-model browser test skips itself
        pass
    env = {**os.environ, "ATTNVIZ_MODEL_ROOTS": os.pathsep.join([str(pretrained_dir()), str(models)])}
    env["ATTNVIZ_HEAVY_WARM"] = "1"  # the served default: its walks compute on workers warmed at the first model
    with running_app(env) as url:
        yield url


@pytest.fixture(scope="module")
def server(browser_app):
    """The session's app server (conftest.browser_app): the browser modules share one start and its warm models."""
    return browser_app


@pytest.fixture(scope="module")
def browser():
    """One chromium for the module: its tests open their pages in conftest.browser_tab, or in pages of their own."""
    from playwright.sync_api import sync_playwright

    _need_browser()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _wait_for_run(page) -> None:
    """The run has ended and the page has stopped drawing (browser_wait.settled): no fixed sleep."""
    settled(page, page.url)


# Every drawn plot's title against its own x tick labels: the boxes of those that overlap.
_TITLE_CLASHES = """() => {
    const clashes = [];
    for (const plot of document.querySelectorAll('.js-plotly-plot')) {
        const title = plot.querySelector('.gtitle');
        if (!title || !title.textContent.trim()) continue;
        const a = title.getBoundingClientRect();
        for (const tick of plot.querySelectorAll('.xtick text')) {
            const b = tick.getBoundingClientRect();
            if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
                clashes.push(title.textContent + ' / ' + tick.textContent);
        }
    }
    return clashes;
}"""


def _plot_titles(page) -> list[str]:
    return page.locator(".js-plotly-plot .gtitle").evaluate_all("titles => titles.map(t => t.textContent.trim())")


def test_a_link_opens_the_exact_view_and_bad_values_fall_back_with_a_notice(server, browser_tab):
    page = browser_tab.page({"width": 1400, "height": 1000})
    # head 2: not the head this layer opens on, which a link leaves out of the address bar
    page.goto(f"{server}/explorer?model=reverse&src=h+e+l+l+o&kind=encoder&layer=2&head=2")
    _wait_for_run(page)
    assert page.locator("[data-testid='stException']").count() == 0
    assert "Encoder self-attention, layer 2, head 2" in _plot_titles(page)
    assert page.locator("textarea").first.input_value() == "h e l l o"
    assert "layer=2" in page.url and "head=2" in page.url, "the address bar keeps the view"

    page.goto(f"{server}/explorer?layer=99&kind=bogus")
    _wait_for_run(page)
    assert page.locator("[data-testid='stException']").count() == 0
    toast = page.locator("[data-testid='stToast']").all_inner_texts()
    assert any("layer='99'" in t and "kind='bogus'" in t for t in toast), toast
    _, layer, head = api.clearest_head(api.load("en-de"))  # where a link's bad values fall back
    assert f"Cross-attention (encoder-decoder), layer {layer}, head {head}" in _plot_titles(page)
    page.screenshot(path=str(ARTIFACTS / "link-fallback.png"))


def test_clicking_an_importance_cell_switches_that_head_off(server, browser_tab):
    """A real click on the importance grid of "Beyond the weights" fills the ablation panel."""
    page = browser_tab.page({"width": 1400, "height": 1000})
    page.goto(f"{server}/beyond")
    _wait_for_run(page)
    grid = page.locator(".js-plotly-plot", has_text="Decoder self-attention (masked)").last
    grid.scroll_into_view_if_needed()
    cell = grid.locator(".scatterlayer path.point").first  # layer 1, head 1: the first cell
    cell.wait_for(state="visible", timeout=60_000)
    box = cell.bounding_box()
    assert box is not None, "the grid's cells are drawn"
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    _wait_for_run(page)
    chosen = page.locator("[data-testid='stMultiSelect']").first.inner_text()
    assert "decoder:1.1" in chosen, chosen
    # the panel's outputs, whatever the retrained model writes with that head off
    assert page.get_by_text("With 1 head off:").count() >= 1, "the panel shows that head switched off"
    assert page.locator("[data-testid='stException']").count() == 0


def _no_exception(page, what: str) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, f"exception on {what}"


def test_a_1000_token_input_opens_every_view(server, browser_tab):
    """A random model whose positions allow 1000 tokens: every view of the explorer, and Compare, draw."""
    from urllib.parse import urlencode

    views = ["One head", "All heads (model view)", "Lines", "Aggregate", "Head statistics", "Q-K embedding"]
    base = {"model": CUSTOM_PATH, "model_path": "long", "src": letters(LONG - 1), "kind": "encoder"}
    page = browser_tab.page({"width": 1400, "height": 1000})
    for view in views:
        contrast = "logarithmic" if view == "Lines" else "each row to its maximum"  # as the radio shows it
        extra = {"contrast": contrast, "words": "true" if view == "Lines" else "false"}
        page.goto(f"{server}/explorer?" + urlencode({**base, "view": view, **extra}))
        _wait_for_run(page)
        _no_exception(page, view)
        assert page.locator("[data-testid='stToast']").count() == 0, f"a link value was set aside on {view}"
        assert page.locator(".js-plotly-plot, [data-testid='stDataFrame']").count() >= 1, f"nothing on {view}"
        if view == "One head":
            assert page.locator(".js-plotly-plot .im image").count() == 1, "the long map is an image"
            assert "1000 x 1000, one pixel per weight" in " ".join(_plot_subtitles(page))
            page.screenshot(path=str(ARTIFACTS / "long-one-head.png"))
        if view == "All heads (model view)":
            page.screenshot(path=str(ARTIFACTS / "long-grid.png"))
    link = {**base, "cmp_src": letters(LONG - 1)[:-2] + " q", "cmp_kind": "encoder"}  # same shape
    page.goto(f"{server}/compare?" + urlencode(link))
    _wait_for_run(page)
    _no_exception(page, "compare")
    assert page.locator(".js-plotly-plot").count() == 3, "A, B and their difference"
    page.screenshot(path=str(ARTIFACTS / "long-compare.png"))


def _plot_subtitles(page) -> list[str]:
    return page.locator(".js-plotly-plot").evaluate_all("plots => plots.map(p => p.textContent)")


def test_a_click_on_the_grid_opens_that_head(server, browser_tab):
    page = browser_tab.page({"width": 1400, "height": 1000})
    page.goto(f"{server}/explorer?model=en-de&kind=encoder&view=All+heads+%28model+view%29")
    _wait_for_run(page)
    # The script has finished; plotly draws the grid after that, in the browser: wait for its
    # points, never count them at once (0 were found on a loaded machine).
    selector = ".js-plotly-plot .scatterlayer .trace .points path"
    page.wait_for_function(f"() => document.querySelectorAll({selector!r}).length >= 12", timeout=60_000)
    points = page.locator(selector)
    assert points.count() == 3 * 4, "one point per layer and head of en-de"
    box = points.nth((2 - 1) * 4 + (3 - 1)).bounding_box()  # layer 2, head 3
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
        ".some(t => t.textContent.includes('layer 2, head 3'))",
        timeout=60_000,
    )
    _wait_for_run(page)
    _no_exception(page, "the grid's click")
    assert "Encoder self-attention, layer 2, head 3" in _plot_titles(page)
    assert "view=one" in page.url or "view=" not in page.url, page.url
    page.screenshot(path=str(ARTIFACTS / "grid-click.png"))


# In presenter mode the page fits the screen's width and the sidebar is folded away.
_ROOM = """() => {
    const sidebar = document.querySelector("[data-testid='stSidebar']");
    return {
        sideways: document.documentElement.scrollWidth - window.innerWidth,
        sidebar: sidebar ? sidebar.getBoundingClientRect().right : 0,
    };
}"""


# ATTNVIZ_SCREENSHOTS=1: the presenter test saves every view (docs/screenshots/present-*.png come from
# there); otherwise only the views that fail, as each picture of a 1920x1080 page costs the run time.
EVERY_SHOT = os.environ.get("ATTNVIZ_SCREENSHOTS") == "1"


PRESENTER_SIZES = ((1920, 1080), (1280, 720))  # a projector's screen and a small one


def _presenter_problems(page, view: str, width: int, height: int) -> list[str]:
    """The problems a room would have with ``view`` at this size, one line each (the checks: see the test below)."""
    where = f"{view} at {width}x{height}"
    _no_exception(page, f"{where} in presenter mode")
    assert page.locator("[data-testid='stToast']").count() == 0, where
    room = page.evaluate(_ROOM)
    assert room["sideways"] <= 0, f"{where} scrolls sideways: {room}"
    assert room["sidebar"] <= 0, f"{where}: the sidebar is not folded away: {room}"
    limits = [presenter_checks.MIN_TEXT_PX, presenter_checks.MAX_TITLE_GAP_PX]
    measure = [*limits, presenter_checks.PICTURE_TITLES.get(view)]
    seen = page.evaluate(presenter_checks.MEASURE, measure)
    if seen["problems"]:  # what a room sees stays: measured again after a second, a late redraw is over
        page.wait_for_timeout(1000)
        settled(page, where)
        seen = page.evaluate(presenter_checks.MEASURE, measure)
    problems = []
    picture = seen["picture"]
    if picture is None:
        problems.append(f"{where}: no main picture")
    elif picture["bottom"] > height:
        problems.append(f"{where}: {picture['name']!r} ends at {picture['bottom']:.0f} px, below the fold")
    problems += [f"{where}: {problem}" for problem in dict.fromkeys(seen["problems"])]
    if problems or EVERY_SHOT:  # a picture of a view that fails; all of them on request
        shot = re.sub(r"[^a-z0-9]+", "-", view.lower()).strip("-")
        page.screenshot(path=str(ARTIFACTS / f"present-{shot}-{width}.png"))
    return problems


def test_presenter_mode_puts_each_pages_picture_on_a_readable_first_screen(server, browser_tab):
    """Every page, every tab and every walkthrough stage in presenter mode (presenter_checks), at 1920x1080 and
    at 1280x720: the main picture whole on the first screen, no empty band under a chart's title, colour bars'
    labels apart, axis titles whole, slider values clear of their sliders, and no text under 18 px, faded or
    cut short.

    Each view is measured at the size it opened at, then the window takes the other size (the page lays
    itself out again, as a browser window resized on a projector does) and it is measured again; the next
    view opens at that size. A resize cost chromium 0.2-1.0 CPU s where opening the page again cost 2.2-5.6
    (2-core AMD EPYC, AVX2 only): the two sizes once walked every page each."""
    from attnviz.lessons.walkthrough import stage_list

    stages = [title for _, title in stage_list(encoder_only=False)]  # the default model has both halves
    sizes = list(PRESENTER_SIZES)
    failures = []
    page = browser_tab.page({"width": sizes[0][0], "height": sizes[0][1]})
    for name, path in PAGES.items():
        for view in presenter_checks.views(page, f"{server}/{path}", name, settled, stages):
            for i, (width, height) in enumerate(sizes):
                if i:
                    resized(page, width, height, f"{view} at {width}x{height}")
                failures += _presenter_problems(page, view, width, height)
            sizes.reverse()  # the next view opens at the size this one ended at
    assert not failures, f"{len(failures)} problems:\n" + "\n".join(failures)


def test_a_page_is_not_read_while_a_font_loads_or_plotly_redraws(server, browser_tab):
    """browser_wait.settled waits for plotly's own late drawing: a font still loading (plotly draws all
    again once it is in) and a chart busy with its margins. A page read before that can show a legend
    laid out in one font in the room left for another: the likely reading of a presenter check that
    failed once in CI (a band of 56 px under a title, on a loaded machine; not reproduced here)."""
    from browser_wait import DRAWN

    page = browser_tab.page({"width": 1280, "height": 720})
    held = []

    def hold(route) -> None:  # the font's file, answered when the test says
        held.append(route)

    page.route("**/held-font.woff2", hold)
    try:
        page.goto(f"{server}/formation?present=1")
        settled(page, "formation")
        assert page.evaluate(DRAWN) is not None
        page.evaluate(
            "() => { const f = new FontFace('Held', 'url(/held-font.woff2)'); document.fonts.add(f);"
            " f.load().catch(() => {}); }"
        )
        page.wait_for_function("() => document.fonts.status === 'loading'")
        assert page.evaluate(DRAWN) is None, "a page read while a font loads"
        for _ in range(500):  # the request reaches the route while the test waits on the page
            if held:
                break
            page.wait_for_timeout(20)
        assert held, "the font's request never came"
        for route in held:
            route.fulfill(status=404)
        page.wait_for_function("() => document.fonts.status === 'loaded'")
        assert page.evaluate(DRAWN) is not None
        plot = "document.querySelector(\"[data-testid='stMain'] .js-plotly-plot\")"
        for busy in ("_fontLoadToken", "_fullLayout._replotting", "_fullLayout._redrawFromAutoMarginCount"):
            page.evaluate(f"() => {{ {plot}.{busy} = 1; }}")
            assert page.evaluate(DRAWN) is None, f"a page read while a chart's {busy} is set"
            page.evaluate(f"() => {{ delete {plot}.{busy}; }}")
        assert page.evaluate(DRAWN) is not None
    finally:
        page.unroute("**/held-font.woff2", hold)  # the next test's pages load as a visitor's do


def _from_this_server(url: str) -> bool:
    """Whether a request stays on 127.0.0.1: an address there, or a blob made by a page from there
    (``blob:http://127.0.0.1:PORT/...``: Streamlit's components load their script that way)."""
    from urllib.parse import urlparse

    return urlparse(url.removeprefix("blob:")).hostname == "127.0.0.1"


def test_a_crafted_link_draws_no_link_and_no_image_on_any_page(server, browser_tab):
    """Markdown, HTML and bare addresses in every parameter stay text: nothing points off this server."""
    from urllib.parse import urlencode

    link, image = "[Session expired: log in again](https://evil.example/login)", "![t](http://evil.example/t.png)"
    params = {key: link for key in ("src", "tgt", "cmp_src", "at_folder", "model_path")}
    params.update({"head": image, "layer": "<img src=http://evil.example/x.png>", "kind": "www.evil.example"})
    outside = "a[href*='evil.example'], img[src*='evil.example'], [style*='evil.example']"
    page = browser_tab.page({"width": 1400, "height": 1000})
    requests = []

    def elsewhere(request) -> None:
        if not _from_this_server(request.url):
            requests.append(request.url)

    page.on("request", elsewhere)
    try:
        for name, path in PAGES.items():
            page.goto(f"{server}/{path}?" + urlencode(params))
            _wait_for_run(page)
            _no_exception(page, f"{name} opened from a crafted link")
            assert page.locator(outside).count() == 0, f"{name} draws a link or an image the app did not put there"
        assert not requests, f"the browser asked another host for {requests}"
    finally:
        page.remove_listener("request", elsewhere)


@pytest.mark.parametrize(
    ("link", "heading", "title"),
    [
        ("atlas?at_kind=encoder&at_layer=2&at_head=3", "Head atlas", "Layer 2, head 3"),
        ("explorer?model=reverse&src=h+e+l+l+o&kind=encoder&layer=2&head=3", "Attention explorer", "layer 2, head 3"),
    ],
)
def test_a_deep_link_opened_first_after_a_restart_gets_the_whole_frame(browser_tab, link, heading, title):
    """A server's first run goes through Streamlit's old pages/ mode and runs the page file alone: the
    frame, called by the page itself, must still draw the sidebar, the title, the view and the footer."""
    with running_app(dict(os.environ)) as url:
        page = browser_tab.page({"width": 1400, "height": 1000})
        page.goto(f"{url}/{link}")  # the first request this server ever serves
        _wait_for_run(page)
        assert page.locator("[data-testid='stException']").count() == 0
        links = page.locator("[data-testid='stSidebar'] [data-testid='stPageLink']").all_inner_texts()
        assert [t.strip().splitlines()[-1] for t in links] == [pg.title for pg in registry.PAGES], "the sidebar"
        assert page.locator("h1").first.inner_text().strip() == heading
        assert any(title in t for t in page.locator("body").all_inner_texts()), "the linked view"
        assert page.get_by_text("Every choice on this page is in the address bar").count() == 1, "the footer"


LM_MODELS = [{"model": "induction"}] + [{"model": CUSTOM_PATH, "model_path": family} for family in LM_FAMILIES]


_HEADING_IS = """h => {
    const title = document.querySelector("[data-testid='stMain'] h1");
    return !!title && title.textContent.trim() === h;
}"""


def _go_by_the_sidebar(page, registered) -> None:
    """Click the sidebar's link to the page ``registered`` (a registry.Page), wait for its heading, then for
    its run to end and draw. Streamlit switches pages in the open document: no reload of the app's
    scripts, about half a page load's chromium time (measured: 1.0-4.3 CPU s a page against 2.6-6.6)."""
    from urllib.parse import urlparse

    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    heading = registered.heading or registered.title
    page.locator("[data-testid='stSidebar'] [data-testid='stPageLink']").filter(has_text=registered.title).first.click()
    try:  # the new page's first element: until then the old page's drawing is still on screen
        page.wait_for_function(_HEADING_IS, arg=heading, timeout=RUN_ENDS_S * 1000)
    except PlaywrightTimeout:
        raise AssertionError(f"the sidebar's {registered.title!r} did not open its page; at {page.url}") from None
    settled(page, registered.title)
    assert urlparse(page.url).path == f"/{registered.url_path}", f"the sidebar's {registered.title!r} opened {page.url}"


@pytest.mark.parametrize("model", LM_MODELS, ids=["induction", *LM_FAMILIES])
def test_every_page_draws_a_language_model(server, browser_tab, model):
    """The shipped induction model and random GPT-2, Llama and Qwen2 folders on every page: each page draws
    with no exception and no error message, and the sidebar asks for a prompt. Each model opens a quarter of
    the pages from a link and reaches the others by the sidebar, as a visitor does; the four models share
    the pages out, so that every page is opened from a language model's link by one of them (measured
    alone on a 2-core AVX2 EPYC: chromium 160 CPU s for the four, against 221 with a link for every page)."""
    from urllib.parse import urlencode

    if model.get("model_path") in LM_FAMILIES:
        pytest.importorskip("transformers")
    params = {**model, "src": "q w e r t y q w e r t y" if model["model"] == "induction" else "the cat sat on"}
    which = LM_MODELS.index(model)
    pages = list(registry.PAGES)
    pages = pages[which:] + pages[:which]  # the walk starts on a page this model opens from a link
    page = browser_tab.page({"width": 1400, "height": 1000})
    for at, registered in enumerate(pages):
        name, path = registered.url_path or "home", registered.url_path
        if at % len(LM_MODELS) == 0:
            page.goto(f"{server}/{path}?" + urlencode(params))
            _wait_for_run(page)
        else:
            _go_by_the_sidebar(page, registered)
        _no_exception(page, f"{name} on a language model")
        errors = page.locator("[data-testid='stAlertContentError']").all_inner_texts()
        assert not errors, f"{name}: {errors}"
        assert page.get_by_text("Prompt", exact=True).count() >= 1, f"{name}: the sidebar asks for a prompt"
        chosen = page.locator("[data-testid='stSidebar'] [data-testid='stSelectbox'] input").first.input_value()
        assert chosen == params["model"], f"{name}: the sidebar left the model for {chosen!r}"
    name = params.get("model_path", params["model"])
    page.screenshot(path=str(ARTIFACTS / f"lm-{name}-last-page.png"))


def test_a_long_prompt_is_drawn_tile_by_tile_and_a_dragged_box_zooms_exactly(server, browser_tab):
    """A 3000-token prompt, over what the server makes at once: one head's overview, a box dragged on it
    opens that region exactly (its weights on hover), and every head and the statistics draw too."""
    from urllib.parse import urlencode

    params = {"model": CUSTOM_PATH, "model_path": "long-lm", "src": letters(LONG_LM - 1), "layer": "2", "head": "1"}
    overview = f"queries 0-{LONG_LM - 1}, keys 0-{LONG_LM - 1}"
    page = browser_tab.page({"width": 1400, "height": 1000})
    page.goto(f"{server}/explorer?" + urlencode({**params, "view": "One head"}))
    _wait_for_run(page)
    _no_exception(page, "a long prompt's one head")
    assert page.get_by_text("tile by tile", exact=False).count() >= 1
    assert page.locator(".js-plotly-plot").filter(has_text=overview).count() == 1, "the overview"
    zoom = "head 1: queries"
    assert "queries 0-47, keys 0-47" in page.evaluate(ZOOM_TITLE, zoom), "the zoom opens on the first positions"
    drag_box(page, ["head 1", overview], LONG_LM, (2000, 2090), (1000, 1090))
    page.mouse.up()
    moved = f"(text) => {{ const t = ({ZOOM_TITLE})(text); return !!t && !t.includes('queries 0-47'); }}"
    page.wait_for_function(moved, arg=zoom, timeout=60_000)  # the box's heatmap replaced the first
    _wait_for_run(page)
    title = page.evaluate(ZOOM_TITLE, zoom)
    q0, q1, k0, k1 = (int(v) for v in re.search(r"queries (\d+)-(\d+), keys (\d+)-(\d+)", title).groups())
    assert 1950 <= q0 <= 2050 and 60 <= q1 - q0 < 128, title  # about the box, every cell in it
    assert 950 <= k0 <= 1050 and 60 <= k1 - k0 < 128, title
    assert "zoom_q" in page.url, "the zoom is in the link"
    page.screenshot(path=str(ARTIFACTS / "long-prompt-zoom.png"))
    # The link opens that region, in a new session: the address bar's own, and a range written by hand as
    # one value.
    here, dragged = urlencode({**params, "view": "One head"}), page.url
    for link in (dragged, f"{server}/explorer?{here}&zoom_q=2000-2090&zoom_k=1000,1090"):
        page = browser_tab.page({"width": 1400, "height": 1000})
        page.goto(link)
        _wait_for_run(page)
        _no_exception(page, "a zoom link")
        opened = page.evaluate(ZOOM_TITLE, zoom) or ""
        want = title if link == dragged else "queries 2000-2090, keys 1000-1090"
        assert opened.endswith(want[want.index("queries") :]), (link[-80:], opened)
        page.locator(".js-plotly-plot").filter(has_text=opened).first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "long-prompt-zoom-link.png"))
    for view in ("All heads (model view)", "Head statistics"):
        page.goto(f"{server}/explorer?" + urlencode({**params, "view": view}))
        _wait_for_run(page)
        _no_exception(page, f"a long prompt's {view}")
        errors = page.locator("[data-testid='stAlertContentError']").all_inner_texts()
        assert not errors, f"{view}: {errors}"
    assert page.locator("[data-testid='stDataFrame']").count() == 1, "the statistics table"


# The Q-K embedding's drawn tokens as the browser laid them out: the pairs that overlap (by more than a pixel),
# how many tokens and points are drawn, and the boxes of the chart, its plot area and its titles.
QK_TOKENS_APART = """() => {
    const plot = document.querySelector("[data-testid='stMain'] .js-plotly-plot");
    const boxes = [...plot.querySelectorAll('.textpoint text')].filter(t => t.textContent.trim())
        .map(t => [t.textContent, t.getBoundingClientRect()]);
    const over = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
    const overlapping = [];
    boxes.forEach(([s, a], i) => boxes.slice(i + 1).forEach(([t, b]) => { if (over(a, b)) overlapping.push([s, t]); }));
    const box = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
    return {drawn: boxes.length, points: plot.querySelectorAll('.scatterlayer .point').length, overlapping,
            chart: box(plot), plot: box(plot.querySelector('.nsewdrag')),
            titles: [...plot.querySelectorAll('.gtitle, .gtitle-subtitle')].map(box)};
}"""


def test_the_qk_embeddings_tokens_never_cover_each_other(server, browser_tab):
    """The default sentence's Q-K embedding as a visitor, a projector and a phone draw it: no drawn token covers
    another (checked on the browser's own text layout, not the figure's estimate), the caption counts the
    tokens left to the hover, no title runs off the chart, and on a phone the plot keeps most of the width."""
    import re

    for what, viewport, query in (
        ("1280x720", {"width": 1280, "height": 720}, "view=qk"),
        ("presenter mode", {"width": 1280, "height": 720}, "view=qk&present=true&kind=decoder"),
        ("a phone", {"width": 390, "height": 844}, "view=qk&kind=encoder"),
    ):
        page = browser_tab.page(viewport)
        page.goto(f"{server}/explorer?{query}")
        _wait_for_run(page)
        _no_exception(page, what)
        found = page.evaluate(QK_TOKENS_APART)
        assert not found["overlapping"], f"{what}: tokens drawn over each other: {found['overlapping']}"
        caption = " ".join(page.locator("[data-testid='stMain'] [data-testid='stCaptionContainer']").all_inner_texts())
        hover = re.search(r"(\d+) of the tokens are on hover only", caption)
        assert found["drawn"] + (int(hover.group(1)) if hover else 0) == found["points"], (what, found, caption)
        assert found["drawn"] >= found["points"] // 2, f"{what}: most tokens are drawn: {found}"
        left, _, right, _ = found["chart"]
        for title in found["titles"]:
            assert left - 1 <= title[0] and title[2] <= right + 1, f"{what}: a title runs off the chart: {found}"
        plot_width, chart_width = found["plot"][2] - found["plot"][0], right - left
        if viewport["width"] < 640:
            assert plot_width >= 0.6 * chart_width, f"{what}: the plot is {plot_width:.0f} of {chart_width:.0f} px"
