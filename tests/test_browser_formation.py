""" "How attention forms" in a real browser, as a person uses it: Play advances the step, a click on a head's line
picks that head, Shift+Right steps (headless Debian chromium via playwright).

Each shipped history is opened when the model ships one; the reverse and induction models are also opened with
the small histories of tests/formation_histories.py, whose steps the test knows. The server and the browser set-up
are test_browser.py's.
"""

from __future__ import annotations

import os
from urllib.parse import urlencode

import presenter_checks
import pytest
from browser_wait import resized, settled
from formation_histories import STEPS, write_history
from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _need_browser, running_app

from attnviz.app import CUSTOM_PATH
from attnviz.checkpoints.catalog import pretrained_dir
from attnviz.lessons import formation

pytestmark = pytest.mark.slow  # a server and a browser

SHIPPED = ("reverse", "en-de", "induction")
COPIES = {"reverse": "reverse-history", "induction": "induction-history"}  # the test's own histories

# The first map's title ("…, step 300"): the step the page shows.
SHOWN_STEP = """() => {
    const title = [...document.querySelectorAll("[data-testid='stMain'] .js-plotly-plot .gtitle")]
        .map(t => t.textContent).find(t => / step \\d+$/.test(t));
    return title ? Number(title.split(' step ').pop()) : null;
}"""
FIRST_TITLE = """() => {
    const t = document.querySelector("[data-testid='stMain'] .js-plotly-plot .gtitle");
    return t ? t.textContent : null;
}"""
# Of the chart of every head's statistic: the line (not the chosen head's, drawn last) whose last point is drawn
# farthest from every other line's last point, as the head its points name, where that point is, in pixels from
# the chart's top left corner, and how far the nearest other is. The lines carry no markers (the chosen head's
# alone does), so the points are placed by plotly's own axes (the click goes through the chart's locator, which
# waits until the chart stands still).
A_LINE = """() => {
    const plot = [...document.querySelectorAll('.js-plotly-plot')]
        .find(p => (p.querySelector('.gtitle') || {}).textContent?.startsWith("Every head's"));
    const {xaxis, yaxis} = plot._fullLayout;
    const ends = plot._fullData.map(t => {  // in the order of the data; x and y decoded (the figure's are base64)
        const x = Array.from(t.x), y = Array.from(t.y), last = x.length - 1;
        return [xaxis._offset + xaxis.l2p(x[last]), yaxis._offset + yaxis.l2p(y[last])];
    });
    let best = null;
    for (let i = 0; i < ends.length - 1; i++) {
        const others = ends.filter((_, j) => j !== i);
        const apart = Math.min(...others.map(e => Math.hypot(e[0] - ends[i][0], e[1] - ends[i][1])));
        if (!best || apart > best.apart)
            best = {head: plot._fullData[i].customdata[0], x: ends[i][0], y: ends[i][1], apart};
    }
    return best;
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    _need_browser()
    models = tmp_path_factory.mktemp("formation-models")
    for model, name in COPIES.items():
        write_history(model, models, name=name)
    env = {**os.environ, "ATTNVIZ_MODEL_ROOTS": os.pathsep.join([str(pretrained_dir()), str(models)])}
    with running_app(env) as url:
        yield url


CASES = [("copy", m) for m in COPIES] + [("shipped", m) for m in SHIPPED]


def _link(where: str, model: str, **params) -> str:
    if where == "shipped":
        if not (pretrained_dir() / model / "history").is_dir():
            pytest.skip(f"{model} ships no history")
        return urlencode({"model": model, **params})
    return urlencode({"model": CUSTOM_PATH, "model_path": COPIES[model], **params})


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _open(tab, url: str, width: int = 1400, height: int = 1000):
    page = tab.page({"width": width, "height": height})
    page.goto(url)
    settled(page, url)
    assert page.locator("[data-testid='stException']").count() == 0, f"an exception at {url}"
    assert page.locator("[data-testid='stAlert']:has-text('went wrong')").count() == 0, f"an error at {url}"
    return page


PLAY = "[data-testid='stMain'] label:has-text('Play')"
# Whether Play's switch shows on (the checkbox input inside its label).
PLAYING = """() => [...document.querySelectorAll("[data-testid='stMain'] label")]
    .find(l => l.textContent.trim() === 'Play').querySelector('input').checked"""


def _switch_play(page, on: bool) -> None:
    """Click Play's switch and wait until it shows ``on``: a click that a page under load did not take (the switch
    unchanged) fails here, apart from a page that went on running after Play showed off."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator(PLAY).click()
    try:
        page.wait_for_function(f"() => ({PLAYING})() === {str(on).lower()}", timeout=30_000, polling=100)
    except PlaywrightTimeout:
        shown = "off" if on else "on"
        raise AssertionError(f"Play clicked {'on' if on else 'off'}: the switch still shows it {shown}") from None


def _steps(page) -> list[int]:
    """The recorded steps: the x values of the loss chart, one per record."""
    return [int(s) for s in page.evaluate(SHOWN_STEP_LIST)]


SHOWN_STEP_LIST = """() => {
    const plot = [...document.querySelectorAll('.js-plotly-plot')]
        .find(p => (p.querySelector('.gtitle') || {}).textContent === 'Loss over training');
    return Array.from(plot._fullData[0].x);  // decoded: the figure's own data are base64
}"""


@pytest.mark.parametrize(("where", "model"), CASES, ids=[f"{w}-{m}" for w, m in CASES])
def test_play_shift_right_and_a_click_on_a_heads_line(server, browser_tab, where, model):
    page = _open(browser_tab, f"{server}/formation?" + _link(where, model))
    try:
        steps = _steps(page)
        if where == "copy":
            assert steps == list(STEPS)
        assert page.evaluate(SHOWN_STEP) == steps[0]

        # Shift+Right: the next record, with no field focused (a field keeps the arrow for its own cursor)
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        page.keyboard.press("Shift+ArrowRight")
        page.wait_for_function(f"() => ({SHOWN_STEP})() === {steps[1]}", timeout=60_000)
        settled(page, "Shift+Right")
        assert f"step={steps[1]}" in page.url, "the step is in the link"

        # Play: the step advances by itself, record by record, until Play is switched off
        _switch_play(page, on=True)
        page.wait_for_function(f"() => ({SHOWN_STEP})() >= {steps[3]}", timeout=60_000)
        _switch_play(page, on=False)
        try:
            settled(page, "Play switched off")
        except AssertionError as e:  # say whether the switch went back on by itself, or stayed off and the page ran on
            raise AssertionError(f"{e} (Play shows {'on' if page.evaluate(PLAYING) else 'off'})") from None
        stopped = page.evaluate(SHOWN_STEP)
        assert stopped in steps[3:]
        page.wait_for_timeout(2500)  # longer than a record is shown while playing
        settled(page, "after Play")
        assert page.evaluate(SHOWN_STEP) == stopped, "Play switched off stops the steps"

        # a click on a head's line picks that head: the maps show it. The point is found relative to the
        # chart, and the click goes through the chart's locator: playwright scrolls the chart into view and
        # waits until it is stable and is what the window shows there, so a page still settling under load
        # cannot move the line away from a click aimed at window coordinates read a moment before.
        chart = page.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text="Every head's"))
        chart.scroll_into_view_if_needed()
        line = page.evaluate(A_LINE)
        assert line["apart"] >= 6, f"every line's last point is within {line['apart']:.0f} px of another's"
        kind, layer, head = formation.parse_head(line["head"])
        at = {"x": line["x"], "y": line["y"]}
        chart.hover(position=at)
        chart.click(position=at)
        wanted = f"{formation.head_name(kind, layer, head, short=True)}, step {stopped}"
        page.wait_for_function(f"() => ({FIRST_TITLE})() === {wanted!r}", timeout=60_000)
        settled(page, "a click on a head's line")
        assert f"formation_head={line['head']}" in page.url or line["head"] in page.url
        assert page.locator("[data-testid='stException']").count() == 0
        page.screenshot(path=str(ARTIFACTS / f"formation-{where}-{model}.png"))
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"formation-{where}-{model}-failed.png"))
        raise


# Every chart's legend that covers part of its plot area, its x axis's tick labels or its title: (chart title,
# what is covered, by how many pixels), none when all is well.
LEGENDS_OVER_PLOTS = """() => [...document.querySelectorAll("[data-testid='stMain'] .js-plotly-plot")].flatMap(p =>
    (%LEGEND_COVERS%)(p).map(([what, px]) => [(p.querySelector('.gtitle') || {}).textContent || '', what, px]))
""".replace("%LEGEND_COVERS%", presenter_checks.LEGEND_COVERS)
# The pages whose charts have legends, as a room sees them: (page, the shipped history it needs). Formation
# with en-de: three kinds of attention and the chosen head, four entries above the plot; with induction: the
# phase change's three under it; linearity: four long entries under the plot.
LEGEND_PAGES = [("formation", "en-de"), ("formation", "induction"), ("linearity", None)]


@pytest.mark.parametrize(("path", "history"), LEGEND_PAGES, ids=[h or p for p, h in LEGEND_PAGES])
def test_no_legend_covers_its_chart_after_the_page_is_narrowed_and_widened(server, browser_tab, path, history):
    """The page drawn at one width, then at others, as when a sidebar folds away or a window is resized: each
    chart's legend stays off its plot and its x axis. With a legend in rows that wrap with the width, hung by
    its bottom, plotly left it where the old count of rows had put it: 36 px over the plot of every head's
    statistic (a presenter check in CI found the band it left under the title), over the tick labels of the
    angle addition; a legend placed in the plot's own units under it sat on the axis title at any width (the
    angle addition's, the phase change's)."""
    link = _link("shipped", history, present=1) if history else urlencode({"present": 1})
    page = _open(browser_tab, f"{server}/{path}?{link}", width=900, height=720)
    for width in (900, 1280, 1100, 1280):
        resized(page, width, 720, f"{path} at {width} px")  # laid out again for the width, then drawn
        assert page.evaluate(LEGENDS_OVER_PLOTS) == [], f"at {width} px wide, after {page.url}"
