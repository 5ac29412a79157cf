"""Waiting in a real browser for what a test asserts: the run's end, then the page's drawing.

Streamlit marks the app ``notRunning`` when the script ends; plotly draws its charts after that, in
the browser. A test that counts plots or points right after the run races the drawing (0 grid
points were once found on a loaded machine), so it waits here until the drawn page stops changing.
"""

from __future__ import annotations

import contextlib
import json

from attnviz.app.viewport import WATCH_KEY

NOT_RUNNING = "[data-testid='stApp'][data-test-script-state='notRunning']"
RUN_ENDS_S = 120  # a slow page on two busy cores
QUIET_MS = 100  # two reads of the drawn page this far apart must agree
# How often a wait here reads the page. Playwright's default, every animation frame, has chromium draw and
# composite 60 frames a second for as long as a test waits: test_browser_formation and test_browser_phone
# took 215 and 219 CPU s of the machine so, against 201 and 205 reading every 100 ms (2-core AMD EPYC,
# AVX2 only; two runs each, alternated).
POLL_MS = 100
RUN_ENDED = f"() => document.querySelector({json.dumps(NOT_RUNNING)}) !== null"

# What the main area shows once drawn (None while a chart is still being drawn): the charts' titles,
# margins and where each chart, its title, its plot areas and its legend sit, compared between two
# reads to tell that the drawing and the layout have stopped (a chart first drawn at one width may be
# laid out again). Plotly (3.x) also draws again on its own after the run, and says so while it waits:
# for a font still loading (it measured its text in a stand-in font, and draws all again once the font
# is in: ``_fontLoadToken``; the font comes from the app's server, slow when loaded) and while it
# redraws for its automatic margins (``_replotting``, ``_redrawFromAutoMarginCount``). And the page
# has been drawn for the window's size: a resize that changes the main area's width asks for one more
# run (attnviz.app.viewport), which the app marks by taking ``data-attnviz-drawn`` off <html> at once.
DRAWN = """() => {
    const main = document.querySelector("[data-testid='stMain']");
    if (!main || main.querySelector("[data-testid='stSkeleton']")) return null;
    // the page's screen watcher (attnviz.app.viewport) waits for a run drawn for the window's new size
    if (document.querySelector('.st-key-%WATCH%') && !document.documentElement.dataset.attnvizDrawn) return null;
    if (document.fonts && document.fonts.status !== 'loaded') return null;
    const charts = [...main.querySelectorAll("[data-testid='stPlotlyChart']")];
    if (charts.some(c => !c.querySelector('.js-plotly-plot .main-svg'))) return null;
    const plots = [...main.querySelectorAll('.js-plotly-plot')];
    const full = p => p._fullLayout || {};
    if (plots.some(p => p._fontLoadToken || full(p)._replotting || full(p)._redrawFromAutoMarginCount)) return null;
    const titles = [...document.querySelectorAll('.js-plotly-plot .gtitle')].map(t => t.textContent);
    const n = s => main.querySelectorAll(s).length;
    const at = el => { const b = el.getBoundingClientRect(); return [b.top, b.width, b.height].map(Math.round); };
    const boxes = plots.map(p => [at(p), full(p)._size,
                                  ...[...p.querySelectorAll('.gtitle, .nsewdrag, .legend')].map(at)]);
    return JSON.stringify([titles, boxes, n("[data-testid='stDataFrame']"),
                           n("[data-testid='stTable']"), n("[data-testid='stVegaLiteChart']")]);
}""".replace("%WATCH%", WATCH_KEY)


def settled(page, what: str, idle: bool = True) -> None:
    """Wait until the run has ended and the page has stopped drawing.

    ``idle=False``: the drawing alone, for a page that runs again on its own. A follower's page polls its
    room twice a second; on two cores busy with other work each poll took longer than that, the next
    began before the last was seen to end, and the page was not seen idle for 120 s (in a fresh-clone
    CI run, and again with two other processes spinning; AVX2-only EPYC), though it showed each change.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        if idle:
            page.wait_for_function(RUN_ENDED, timeout=RUN_ENDS_S * 1000, polling=POLL_MS)
        last = None
        while True:  # plots draw after the script has ended: two reads QUIET_MS apart must agree
            drawn = page.wait_for_function(DRAWN, timeout=60_000, polling=POLL_MS).json_value()
            if drawn == last:
                break
            last = drawn
            page.wait_for_timeout(QUIET_MS)
        if idle:
            page.wait_for_function(RUN_ENDED, timeout=RUN_ENDS_S * 1000, polling=POLL_MS)
    except PlaywrightTimeout as e:
        raise AssertionError(f"{what}: the page did not finish its run and drawing: {e}") from None


# Every visible chart laid out again for its box's width: right after the window is resized the boxes
# have their new width and plotly's charts (Streamlit hands them the width) still the old one.
CHARTS_FIT_THEIR_BOXES = """() =>
    [...document.querySelectorAll("[data-testid='stMain'] [data-testid='stPlotlyChart']")]
    .filter(box => box.getBoundingClientRect().width > 0)
    .every(box => {
        const plot = box.querySelector('.js-plotly-plot');
        return plot && plot._fullLayout && Math.abs(plot._fullLayout.width - box.getBoundingClientRect().width) <= 2;
    })"""


def resized(page, width: int, height: int, what: str) -> None:
    """Give the window this size and wait until the page is laid out and drawn for it (not the old size)."""
    page.set_viewport_size({"width": width, "height": height})
    page.wait_for_function(CHARTS_FIT_THEIR_BOXES, timeout=60_000, polling=POLL_MS)
    settled(page, what)


# Streamlit's loading placeholders (stSkeleton) shimmer, and its spinner and running indicator turn, for as
# long as a run lasts: endless CSS animations, for which chromium draws and composites 60 frames a second
# on the CPU. Stopped here, in every document of a test's browser context: a still placeholder is still
# there for a test (DRAWN waits for it to go), and no test asserts on motion. Measured on a 2-core AMD EPYC
# with AVX2 only: chromium's display compositor 4.3-7.6 -> 0.8 CPU s over six page loads, and 156 -> 140
# CPU s of chromium over test_browser_formation and test_browser_phone (the same rule in a style element).
STILL = """(() => {
    const sheet = new CSSStyleSheet();
    sheet.replaceSync("[data-testid='stSkeleton'], [data-testid='stSpinner'] *, [data-testid='stStatusWidget'] *"
                      + " { animation: none !important; }");
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
})()"""


def still(context):
    """``context`` (a playwright BrowserContext), with Streamlit's endless loading animations stopped (STILL)
    in every document it opens. A page of its own: ``still(browser.new_context(...)).new_page()``, closed
    with its context (``page.context.close()``)."""
    context.add_init_script(STILL)
    return context


class Tab:
    """One tab that a module's tests share, each opening its pages in it by address.

    A new address starts a new Streamlit session (the server keeps nothing of the last page's), and the
    tab's sessionStorage is cleared first (a presenter's tab keeps its room there: `attnviz.app.follow`).
    A fresh context per page cost the machine 10-15 CPU s, a new tab 8-13, and a new address in an open
    tab 3-7 (2-core AMD EPYC, AVX2 only): chromium starts no renderer and compiles plotly's and
    Streamlit's scripts once. One tab, not two: a tab behind another has its timers throttled. A test
    that routes requests or listens to the page's events removes its route or listener when it ends
    (``page.unroute``, ``page.remove_listener``), in a ``finally``: the next test's pages load as a
    visitor's do.
    """

    def __init__(self, browser, init_script: str | None = None):
        self.browser, self.init_script, self._page = browser, init_script, None

    def page(self, viewport: dict):
        """The tab at ``viewport``'s size, ready for a new address (a new context if the last page broke)."""
        from playwright.sync_api import Error

        if self._page is not None and not self._page.is_closed():
            try:
                if self._page.viewport_size != viewport:
                    self._page.set_viewport_size(viewport)
                # a page without storage (a data: address) throws inside; a crashed one cannot evaluate at all
                self._page.evaluate("() => { try { sessionStorage.clear(); } catch (e) {} }")
                return self._page
            except Error:  # a crashed page, left by a test that failed
                self.close()
        context = still(self.browser.new_context(viewport=viewport))
        if self.init_script:
            context.add_init_script(self.init_script)  # in every document the context opens
        self._page = context.new_page()
        return self._page

    def close(self) -> None:
        """Close the tab's context: the next `page` starts a new one."""
        from playwright.sync_api import Error

        if self._page is not None:
            with contextlib.suppress(Error):  # a crashed page's context may be gone already
                self._page.context.close()
        self._page = None
