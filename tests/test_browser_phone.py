"""A phone (390x844) in a real browser: the map right under the title, most of the width, labels apart.

Home and the explorer, as a visitor opens them on a phone: the first chart is the block right after
the page's title; the heatmap's plot area keeps at least 60% of the chart's width; no two key
labels and no two query labels overlap; plotly's toolbar, shown as a finger or a mouse over the
chart shows it, covers no part of the title, which is whole inside the chart; nothing scrolls
sideways; a presenter's link (``present=1``) opens the same way. The same pages on a 1280x720
screen keep their wide layout. And the decoding page's chart titles, two charts to a row, fit their
charts at 1280x720, at 1024x768 and on a phone (attnviz.app.present.room breaks them); and the rows of
buttons of the explorer, decoding, formation and walkthrough pages cut no label short beside the
sidebar at 1024x768 (the decoding page's at 1280x720 too).
The server and the browser set-up are test_browser.py's; screenshots land in test-artifacts/.
"""

from __future__ import annotations

import pytest
from browser_wait import resized, settled
from test_browser import ARTIFACTS, browser, server  # noqa: F401 - the fixtures: the session's server, one chromium

from attnviz.app.viewport import NARROW_PX
from attnviz.figures.common import MODEBAR_PX

pytestmark = pytest.mark.slow  # a server and a browser

PHONE = {"width": 390, "height": 844}
PAGES = {"home": "", "explorer": "explorer"}
# A teacher's presenter link opened on a phone: a phone is no projector, it gets the phone's layout.
PHONE_PAGES = {**PAGES, "home-presenter-link": "?present=1"}

# What the test measures on the drawn page. Boxes are [left, top, right, bottom] in CSS pixels.
MEASURE = """() => {
    const box = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
    const main = document.querySelector("[data-testid='stMain'] [data-testid='stVerticalBlock']");
    const shown = [...main.children].filter(c => c.getBoundingClientRect().height > 0);
    const at = shown.findIndex(c => c.querySelector('h1'));
    const chart = document.querySelector("[data-testid='stMain'] .js-plotly-plot");
    const next = shown[at + 1];
    const labels = axis => [...chart.querySelectorAll(`.${axis}tick text`)]
        .filter(t => t.textContent.trim()).map(t => [t.textContent, box(t)]);
    const modebar = chart.querySelector('.modebar');
    return {
        after_title: next ? (next.contains(chart) ? 'the chart' : next.innerText.slice(0, 80)) : null,
        title: box(shown[at].querySelector('h1')),
        chart: box(chart),
        plot: box(chart.querySelector('.nsewdrag')),
        chart_title: box(chart.querySelector('.gtitle')),
        modebar: modebar ? box(modebar) : null,
        x: labels('x'),
        y: labels('y'),
        sideways: document.documentElement.scrollWidth - window.innerWidth,
        angle: chart.layout.xaxis.tickangle ?? null,
    };
}"""


# The texts of the main area's buttons and widget labels that their box, or a box around them that clips,
# does not hold whole: a label cut short by a column too narrow for it (plotly's own buttons left out).
CUT_LABELS = """() => {
    const holds = (b, r) =>
        r.left >= b.left - 1 && r.right <= b.right + 1 && r.top >= b.top - 1 && r.bottom <= b.bottom + 1;
    const cut = [];
    for (const box of document.querySelectorAll("[data-testid='stMain'] button, [data-testid='stMain'] label")) {
        if (!box.offsetParent || box.closest('.js-plotly-plot')) continue;
        const texts = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
        while (texts.nextNode()) {
            const text = texts.currentNode;
            if (!text.textContent.trim()) continue;
            const range = document.createRange();
            range.selectNodeContents(text);
            const r = range.getBoundingClientRect();
            for (let a = text.parentElement; a; a = a.parentElement) {
                const clips = a === box || getComputedStyle(a).overflowX !== 'visible';
                if (clips && !holds(a.getBoundingClientRect(), r)) { cut.push(text.textContent.trim()); break; }
                if (a === box) break;
            }
        }
    }
    return cut;
}"""


def overlaps(a: list[float], b: list[float]) -> bool:
    """Whether two boxes [left, top, right, bottom] share more than a sliver (half a pixel)."""
    return min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5


def clashes(labels: list) -> list[str]:
    return [
        f"{a} / {b}" for i, (a, box_a) in enumerate(labels) for b, box_b in labels[i + 1 :] if overlaps(box_a, box_b)
    ]


def open_page(tab, url: str, viewport: dict, drawn: str):
    """A fresh visit to ``url`` at ``viewport`` in the module's tab (a new session), once the server has drawn it
    for that width and it has settled."""
    page = tab.page(viewport)
    page.goto(url)
    # The first run is drawn wide; the browser then says how wide it is, and a narrow one gets a second run.
    page.wait_for_selector(f"html[data-attnviz-drawn='{drawn}']", state="attached", timeout=120_000)
    settled(page, url)
    assert page.locator("[data-testid='stException']").count() == 0, f"exception on {url}"
    return page


@pytest.mark.parametrize("name", list(PHONE_PAGES))
def test_on_a_phone_the_map_comes_first_and_keeps_most_of_the_width(server, browser_tab, name):  # noqa: F811
    assert PHONE["width"] < NARROW_PX
    page = open_page(browser_tab, f"{server}/{PHONE_PAGES[name]}", PHONE, "narrow")
    chart = page.locator("[data-testid='stMain'] .js-plotly-plot").first
    chart.scroll_into_view_if_needed()
    chart.hover()  # plotly shows its toolbar while a pointer is over the chart
    page.wait_for_function(
        "() => { const m = document.querySelector(\"[data-testid='stMain'] .modebar\");"
        " return m && getComputedStyle(m.closest('.modebar-container') || m).opacity !== '0'"
        " && m.getBoundingClientRect().width > 0; }",
        timeout=30_000,
    )
    seen = page.evaluate(MEASURE)
    page.screenshot(path=str(ARTIFACTS / f"phone-{name}.png"))
    assert seen["after_title"] == "the chart", f"{name}: after the title comes {seen['after_title']!r}"
    chart_width = seen["chart"][2] - seen["chart"][0]
    plot_width = seen["plot"][2] - seen["plot"][0]
    assert plot_width >= 0.6 * chart_width, f"{name}: the map is {plot_width:.0f} of {chart_width:.0f} px"
    assert len(seen["x"]) >= 2 and len(seen["y"]) >= 2, f"{name}: no labels found: {seen}"
    assert not clashes(seen["x"]), f"{name}: key labels overlap: {clashes(seen['x'])}"
    assert not clashes(seen["y"]), f"{name}: query labels overlap: {clashes(seen['y'])}"
    assert seen["modebar"] is not None, f"{name}: no toolbar shown"
    toolbar, title = seen["modebar"], seen["chart_title"]
    assert not overlaps(toolbar, title), f"{name}: the toolbar {toolbar} covers the title {title}"
    # plotly draws a title wider than its chart on one line, cut at the chart's edge
    assert seen["chart"][0] - 1 <= title[0] and title[2] <= seen["chart"][2] + 1, f"{name}: the title {title} is cut"
    assert seen["sideways"] <= 0, f"{name} scrolls sideways by {seen['sideways']} px"


@pytest.mark.parametrize("name", list(PAGES))
def test_a_wide_screen_keeps_the_wide_layout(server, browser_tab, name):  # noqa: F811 - the fixtures
    """At 1280x720 the browser says it is wide: no second run, the controls and text before the map as before."""
    seen = open_page(browser_tab, f"{server}/{PAGES[name]}", {"width": 1280, "height": 720}, "wide").evaluate(MEASURE)
    assert seen["after_title"] != "the chart", f"{name}: the wide page lost what comes before its map"
    assert seen["angle"] != -90, f"{name}: the wide map has the phone's upright key labels"


# Each chart's title and subtitle as drawn: [text, its box, the chart's box, lines], boxes [left, top, right, bottom].
CHART_TITLES = """() => [...document.querySelectorAll("[data-testid='stMain'] .js-plotly-plot")].flatMap(p => {
    const box = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
    return [...p.querySelectorAll('.gtitle, .gtitle-subtitle')].filter(t => t.textContent.trim())
        .map(t => [t.textContent, box(t), box(p), Math.max(1, t.querySelectorAll('tspan.line').length)]);
})"""


def cut(titles: list) -> list[str]:
    """The titles that run past their chart's left, right or top edge (plotly cuts them there)."""
    return [text for text, t, c, _ in titles if t[0] < c[0] - 1 or t[2] > c[2] + 1 or t[1] < c[1] - 1]


def test_chart_titles_are_broken_to_fit_as_the_window_narrows(server, browser_tab):  # noqa: F811 - the fixtures
    """The decoding page, its charts two to a row: at 1280x720 every title fits; narrowed to 1024x768 beside
    the sidebar, the page is drawn again for its narrower columns and the titles that no longer fit break
    into lines; on a phone every title is whole and starts below plotly's toolbar. Before, plotly drew each
    title on one line and cut it at the chart's edge: five of the page's titles at 1024x768."""
    page = open_page(browser_tab, f"{server}/decoding", {"width": 1280, "height": 720}, "wide")
    titles = page.evaluate(CHART_TITLES)
    assert len(titles) >= 5 and cut(titles) == [], cut(titles)
    assert page.evaluate(CUT_LABELS) == [], "the step buttons' labels at 1280x720"
    resized(page, 1024, 768, "the decoding page at 1024x768")  # and drawn for it (browser_wait.DRAWN)
    titles = page.evaluate(CHART_TITLES)
    assert cut(titles) == [], f"cut at 1024x768: {cut(titles)}"
    assert sum(lines > 1 for *_, lines in titles) >= 4, titles
    page.set_viewport_size(PHONE)
    page.wait_for_selector("html[data-attnviz-drawn='narrow']", state="attached", timeout=120_000)
    settled(page, "the decoding page on a phone")
    titles = page.evaluate(CHART_TITLES)
    page.screenshot(path=str(ARTIFACTS / "phone-decoding-titles.png"), full_page=True)
    assert cut(titles) == [], f"cut on a phone: {cut(titles)}"
    # plotly's toolbar: 24 px buttons 2 px from the chart's top, over its right corner
    under = [text for text, t, c, _ in titles if t[1] < c[1] + MODEBAR_PX - 10]
    assert under == [], f"under the toolbar on a phone: {under}"


def test_no_row_of_buttons_cuts_a_label_short_beside_the_sidebar(server, browser_tab):  # noqa: F811 - the fixtures
    """The pages with rows of buttons, at 1024x768 with the sidebar open: every button's label and key, and every
    widget's label, whole in its box. Before, the buttons stood in fixed columns: the decoding page showed "E", "N"
    and "L" of Back, Next and Last at 1280x720 and no label at 1024x768, and the explorer's head buttons, the
    walkthrough's Previous and Next and the formation page's "Train a small model now" were cut at 1024x768."""
    shown = {}
    for path in ("explorer", "decoding", "formation", "walkthrough"):
        page = open_page(browser_tab, f"{server}/{path}", {"width": 1024, "height": 768}, "wide")
        shown[path] = page.evaluate(CUT_LABELS)
        assert page.locator("[data-testid='stMain'] button").count() >= 2, f"{path}: its buttons are drawn"
    assert shown == {path: [] for path in shown}, f"cut short: {shown}"
