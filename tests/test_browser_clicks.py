"""Click everything as a person does, in a real browser, on every page (headless Debian chromium).

On every page of the registry, with en-de (and with reverse on the home page and the explorer):
every sidebar example, every button of the main area, Shift+Right and Shift+Left where the page
offers keys, a second value in every selectbox, radio and slider; then the address bar's link,
opened in a fresh session, must show the same plots. Any exception, any toast or "set aside"
caption (the test only opens links the app wrote itself) and any blank main area fails, with a
screenshot in test-artifacts/. The server and the browser set-up are test_browser.py's.
"""

from __future__ import annotations

import time

import pytest
from browser_wait import RUN_ENDS_S, Tab, settled
from test_browser import _TITLE_CLASHES, ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, server  # noqa: F401 - server: the fixture

from attnviz.app import registry

pytestmark = pytest.mark.slow  # about 2 to 5 minutes on 2 cores

MAIN = "[data-testid='stMain']"
SIDEBAR = "[data-testid='stSidebar']"
CONTENT = ", ".join(
    f"{MAIN} {s}"
    for s in (
        ".js-plotly-plot",
        "[data-testid='stDataFrame']",
        "[data-testid='stTable']",
        "[data-testid='stVegaLiteChart']",
    )
)
SET_ASIDE = "Set aside from the link"
MAX_ACTIONS = 25  # buttons, keys and widget changes per page: keeps the test bounded
RUN_STARTS_S = 3  # how long an action may take to start a run; one that starts none costs this much
VIEWPORT = {"width": 1400, "height": 1000}

# Installed in every document before the app's own scripts: counts runs (each change of the script
# state away from notRunning) and keeps every toast and exception the page ever showed, so that one
# which vanished before a check (toasts close after a few seconds) is still seen.
WATCH = """(() => {
    const log = {runs: 0, toasts: [], exceptions: []};
    window.__clicks = log;
    const seen = new WeakSet();
    const keep = (selector, into) => {
        for (const el of document.querySelectorAll(selector)) if (!seen.has(el)) { seen.add(el); into.push(el); }
    };
    new MutationObserver(records => {
        for (const r of records) {
            if (r.type !== 'attributes') continue;
            const state = r.target.getAttribute('data-test-script-state');
            if (state !== r.oldValue && state !== 'notRunning' && state !== 'initial') log.runs++;
        }
        keep("[data-testid='stToast']", log.toasts);
        keep("[data-testid='stException']", log.exceptions);
    }).observe(document, {
        subtree: true, childList: true, attributes: true, attributeOldValue: true,
        attributeFilter: ['data-test-script-state'],
    });
})();"""
TAB_INIT_SCRIPT = WATCH  # conftest.browser_tab: in every document the module's tab opens

# What stepping with the keyboard moves: plot titles, the main area's selectboxes, sliders and open tab.
VIEW_STATE = """() => {
    const main = document.querySelector("[data-testid='stMain']");
    const all = s => [...main.querySelectorAll(s)];
    return JSON.stringify({
        titles: all('.js-plotly-plot .gtitle').map(t => t.textContent),
        selects: all("[data-testid='stSelectbox'] input").map(i => i.value),
        sliders: all("[data-testid='stSlider'] input[type='range']").map(i => i.value),
        tab: all("[role='tab'][aria-selected='true']").map(t => t.textContent),
    });
}"""

# Every map whose side margins the app set for its rows and colour bar (attnviz.app.margins.settled: a
# figure of heatmaps alone, one showing its scale at the plot's edge with listed labels, on a category
# y axis with listed labels, its side margins over plotly's 10 px): the margins the figure asked for
# (left, right, top, bottom), those plotly drew it with, and what plotly's own layout pushed at the
# sides (its _pushmargin: the pushes at the plot's left edge and at its right). Asked for and drawn
# are the same when plotly had no margin to widen and the figure to draw again; the pushes are what
# the estimates are measured against.
SETTLED_MAPS = """() => [...document.querySelectorAll("[data-testid='stMain'] .js-plotly-plot")].flatMap(p => {
    const data = p.data || [], layout = p.layout || {}, fl = p._fullLayout;
    const scales = data.filter(t => t.type === 'heatmap' && t.showscale !== false);
    const bar = (scales[0] || {}).colorbar || {}, y = layout.yaxis || {}, asked = layout.margin || {};
    if (!fl || data.some(t => t.type !== 'heatmap') || scales.length !== 1 || bar.x !== 1 || !bar.ticktext
        || y.type !== 'category' || !y.ticktext || !(asked.l > 10 && asked.r > 10)) return [];
    const pushed = (side, at) => Math.max(0, ...Object.entries(fl._pushmargin)
        .filter(([id, push]) => id !== 'base' && push[side] && push[side].val === at)
        .map(([, push]) => push[side].size));
    return [{title: (fl.title.text || '').replace(/<[^>]*>/g, ''), asked: [asked.l, asked.r, asked.t, asked.b],
             drawn: [fl._size.l, fl._size.r, fl._size.t, fl._size.b], pushed: [pushed('l', 0), pushed('r', 1)]}];
})"""
# attnviz.app.margins counts a label by its characters' advances, 1.5% over, rounded up and 2 px more;
# plotly measures the label's drawn box, which leaves out the blank beside its outer glyphs (0.1-0.2 em).
MARGIN_SLACK_PX = 10

# (model, page's address) of every case: every page with the default model, and the small
# character-level model on the pages whose first screen depends most on the model.
CASES = [("en-de", p.url_path) for p in registry.PAGES] + [("reverse", ""), ("reverse", "explorer")]


@pytest.fixture(scope="module")
def browser(server):  # noqa: F811 - server: the fixture imported above
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _open(tab: Tab, url: str):
    """The module's tab (browser_wait.Tab) at ``url`` in a new session, once its first run has drawn."""
    page = tab.page(VIEWPORT)
    page.goto(url)
    page.wait_for_function("() => window.__clicks && window.__clicks.runs > 0", timeout=RUN_ENDS_S * 1000)
    settled(page, url)
    return page


def _act(page, action, what: str) -> None:
    """Do ``action`` (a callable), wait for the run it starts (if any) to end, then check the page."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    runs = page.evaluate("() => window.__clicks.runs")
    action()
    try:  # right after a click the run may not have started yet
        page.wait_for_function("n => window.__clicks.runs > n", arg=runs, timeout=RUN_STARTS_S * 1000)
    except PlaywrightTimeout:
        pass  # e.g. a step button at the end of its range: no run
    settled(page, what)
    _check(page, what)


def _check(page, what: str) -> None:
    log = page.evaluate(
        "() => ({toasts: window.__clicks.toasts.map(t => t.textContent),"
        " exceptions: window.__clicks.exceptions.map(e => e.textContent.slice(0, 2000))})"
    )
    assert not log["exceptions"], f"{what}: an exception: {log['exceptions']}"
    assert not log["toasts"], f"{what}: a toast, though every link opened was the app's own: {log['toasts']}"
    aside = page.locator(f"{MAIN} [data-testid='stCaptionContainer']", has_text=SET_ASIDE).all_inner_texts()
    assert not aside, f"{what}: a set-aside caption, though every link opened was the app's own: {aside}"
    assert page.locator(CONTENT).count() >= 1, f"{what}: the main area is blank (no plot, table or chart)"
    _check_margins(page, what)


def _check_margins(page, what: str) -> int:
    """Every map with settled margins (SETTLED_MAPS) drawn at the margins it asked for, each side within
    MARGIN_SLACK_PX of what plotly found its labels and colour bar push; how many maps there were."""
    maps = page.evaluate(SETTLED_MAPS)
    for chart in maps:
        where = f"{what}: the map {chart['title']!r}"
        assert chart["drawn"] == chart["asked"], f"{where} was widened and drawn again: {chart}"
        for side, asked, pushed in zip("lr", chart["asked"][:2], chart["pushed"], strict=True):
            more = asked - pushed
            assert more <= MARGIN_SLACK_PX, f"{where}: {more:.1f} px more at {side} than it needs: {chart}"
    return len(maps)


def _label(widget) -> str:
    return widget.evaluate(
        "w => (w.querySelector(\"[data-testid='stWidgetLabel']\")?.innerText.trim()"
        " || w.querySelector('[aria-label]')?.getAttribute('aria-label') || '?')"
    )


def _plot_titles(page) -> list[str]:
    return page.locator(".js-plotly-plot .gtitle").evaluate_all("titles => titles.map(t => t.textContent.trim())")


def _choose_model(page, model: str, where: str) -> None:
    box = page.locator(f"{SIDEBAR} [data-testid='stSelectbox']").filter(has=page.get_by_label("Model", exact=True))
    if box.locator("input").input_value() == model:
        return

    def pick():
        box.get_by_role("button", name="Open").click()
        page.get_by_role("option", name=model, exact=True).click()

    _act(page, pick, f"{where}: choosing the model {model} in the sidebar")
    assert box.locator("input").input_value() == model, f"{where}: the sidebar's model is not {model}"


def _click_examples(page, where: str) -> None:
    pills = page.locator(f"{SIDEBAR} [data-testid='stButtonGroup'] button")
    count = pills.count()
    assert count >= 1, f"{where}: the sidebar shows no examples"
    for i in range(count):
        pill = page.locator(f"{SIDEBAR} [data-testid='stButtonGroup'] button").nth(i)
        example = pill.inner_text().strip()
        what = f"{where}: sidebar example {i + 1} {example!r}"
        _act(page, pill.click, what)
        source = page.locator(f"{SIDEBAR} textarea").first.input_value()
        assert source == example, f"{what}: the sentence box holds {source!r}"


def _press_buttons(page, where: str, budget: list[int]) -> None:
    # Buttons with a tooltip are drawn twice, once hidden: only the visible one is what a person sees.
    buttons = page.locator(f"{MAIN} [data-testid='stButton'] button").filter(visible=True)
    i = 0
    while i < buttons.count() and budget[0] > 0:
        button = buttons.nth(i)
        label = button.inner_text().replace("\n", " ").strip()
        i += 1
        if button.is_disabled():
            continue
        budget[0] -= 1
        _act(page, button.click, f"{where}: button {label!r}")


def _steps_with_keys(page, where: str, budget: list[int]) -> None:
    """Shift+Right, then Shift+Left, with nothing focused, on a page whose buttons show those keys."""
    keys = page.locator(f"{MAIN} kbd").all_inner_texts()
    if not any("→" in k for k in keys) or not any("←" in k for k in keys):
        return
    budget[0] -= 2
    states = [page.evaluate(VIEW_STATE)]
    for key in ("Shift+ArrowRight", "Shift+ArrowLeft"):

        def press(key=key):
            page.locator(f"{MAIN} h1").first.click()  # a click on the title: no input keeps the focus
            page.keyboard.press(key)

        _act(page, press, f"{where}: key {key}")
        states.append(page.evaluate(VIEW_STATE))
    before, right, left = states
    if right != before:
        assert left == before, f"{where}: Shift+Left did not undo Shift+Right: {before} -> {right} -> {left}"
    else:  # at the end of the range: only stepping back moves
        assert left != before, f"{where}: neither Shift+Right nor Shift+Left changed the view: {before}"


def _pick_in_selectbox(page, widget) -> bool:
    widget.get_by_role("button", name="Open").click()
    options = page.get_by_role("option")
    options.first.wait_for()
    if options.count() < 2:
        page.keyboard.press("Escape")
        return False
    second = options.nth(1)
    (options.nth(0) if second.get_attribute("aria-selected") == "true" else second).click()
    return True


def _pick_in_radio(page, widget) -> bool:
    choices = widget.locator("[data-testid='stRadioOption']")
    if choices.count() < 2:
        return False
    second = choices.nth(1)
    (choices.nth(0) if second.get_attribute("data-selected") == "true" else second).click()
    return True


def _pick_in_slider(page, widget) -> bool:
    thumb = widget.locator("input[type='range']").first
    thumb.focus()
    at_end = thumb.get_attribute("value") == thumb.get_attribute("max")
    page.keyboard.press("ArrowLeft" if at_end else "ArrowRight")
    return True


def _pick_second_values(page, where: str, budget: list[int]) -> None:
    for kind, testid, pick in (
        ("selectbox", "stSelectbox", _pick_in_selectbox),
        ("radio", "stRadio", _pick_in_radio),
        ("slider", "stSlider", _pick_in_slider),
    ):
        widgets = page.locator(f"{MAIN} [data-testid='{testid}']").filter(visible=True)
        i = 0
        while i < widgets.count() and budget[0] > 0:  # re-counted each time: a change may add or remove widgets
            widget = widgets.nth(i)
            i += 1
            disabled = widget.locator("input:disabled, [data-disabled='true'], [aria-disabled='true']").count()
            if disabled:
                continue
            label = _label(widget)
            budget[0] -= 1
            _act(page, lambda widget=widget, pick=pick: pick(page, widget), f"{where}: {kind} {label!r}")


def _follow_the_link(tab: Tab, page, where: str) -> None:
    """The address bar's link, opened in a new session (in the same tab: the page clicked is done with)."""
    url, titles = page.url, _plot_titles(page)
    page = _open(tab, url)
    try:
        _check(page, f"{where}: the address bar's link {url} in a fresh session")
        again = _plot_titles(page)
        assert again == titles, f"{where}: the link {url} shows other plots: {again} instead of {titles}"
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"clicks-{where.replace(' ', '-')}-link-failed.png"))
        raise


@pytest.mark.parametrize(("model", "path"), CASES, ids=[f"{m}-{p or 'home'}" for m, p in CASES])
def test_clicking_everything_a_person_can(server, browser_tab, model, path):  # noqa: F811 - server: the fixture
    where = f"{path or 'home'} with {model}"
    started = time.monotonic()
    page = _open(browser_tab, f"{server}/{path}")
    try:
        _check(page, f"{where}: the first screen")
        if path in ("", "explorer"):  # the first screen's map: the check above has a map to measure
            assert _check_margins(page, where) >= 1, f"{where}: no map with margins for its labels"
        assert not page.evaluate(_TITLE_CLASHES), f"{where}: a title runs into its key labels on the first screen"
        _choose_model(page, model, where)
        _click_examples(page, where)
        budget = [MAX_ACTIONS]
        _press_buttons(page, where, budget)
        _steps_with_keys(page, where, budget)
        _pick_second_values(page, where, budget)
        _follow_the_link(browser_tab, page, where)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"clicks-{model}-{path or 'home'}-failed.png"))
        raise
    print(f"{where}: {time.monotonic() - started:.1f} s")
