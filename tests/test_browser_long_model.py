"""A real browser opens the shipped long-context model on its 4,095-token probe: the long view draws.

`induction-long` reads its `probe.txt` (2,047 made-up words, then the same again) in the explorer:
the maps (2 layers x 4 heads x 4,095^2 floats, 537 MB) are over ATTNVIZ_FULL_MAPS_MB, so the head
is drawn tile by tile. A box dragged on the overview's induction stripe opens that region exactly,
and its weights, read back from the drawn heatmap, peak where the card says: 2,046 tokens back.
Screenshots land in test-artifacts/.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import numpy as np
import pytest
from browser_wait import settled, still
from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _no_exception

from attnviz.checkpoints.catalog import pretrained_dir

pytestmark = pytest.mark.slow  # a server and a browser: the full suite

NAME = "induction-long"
FOLDER = pretrained_dir() / NAME
PERIOD = 2047  # words in each half of the probe: a repeated word's earlier occurrence is 2,047 back

# The heatmap whose title holds the text: its z, as rows of numbers (plotly keeps typed arrays or lists).
HEATMAP_Z = """(text) => {
    const plot = [...document.querySelectorAll('.js-plotly-plot')]
        .find(p => [...p.querySelectorAll('.gtitle')].some(t => t.textContent.includes(text)));
    const trace = plot && plot._fullData.find(t => t.type === 'heatmap');  // z decoded from its base64
    return trace ? JSON.stringify(Array.from(trace.z, row => Array.from(row, v => v ?? 0))) : null;
}"""
TITLE_WITH = """(text) => [...document.querySelectorAll('.js-plotly-plot .gtitle')]
  .map(t => t.textContent).find(t => t.includes(text)) || null"""


@pytest.fixture(scope="module")
def server(browser_app):
    """The session's app server (conftest.browser_app), whose roots hold the shipped models."""
    return browser_app


def test_the_probe_is_drawn_tile_by_tile_and_a_box_on_the_induction_stripe_zooms_to_it(server):
    from bench_render import drag_box  # on the path once test_browser is imported
    from playwright.sync_api import sync_playwright

    info = json.loads((FOLDER / "config.json").read_text())
    layer, head = (int(n) for n in re.fullmatch(r"layer (\d+) head (\d+)", info["heads"]["induction"]).groups())
    probe = (FOLDER / "probe.txt").read_text().strip()
    T = info["long_text"]["tokens"]
    params = {"model": NAME, "src": probe, "layer": str(layer), "head": str(head)}
    overview = f"queries 0-{T - 1}, keys 0-{T - 1}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = still(browser.new_context(viewport={"width": 1400, "height": 1000})).new_page()
        try:
            page.goto(f"{server}/explorer?" + urlencode({**params, "view": "One head"}))
            settled(page, "the probe's one head")
            whole = page.locator(".js-plotly-plot").filter(has_text=overview)
            whole.first.wait_for(timeout=240_000)
            settled(page, "the probe's one head")
            _no_exception(page, "the probe's one head")
            assert whole.count() == 1, "the overview: the whole map, max-pooled"
            assert page.get_by_text("tile by tile", exact=False).count() >= 1, "the long view says how it draws"
            assert page.get_by_text("the induction head that this model's card names", exact=False).count() == 1
            whole.first.screenshot(path=str(ARTIFACTS / "long-model-overview.png"))
            # In the repeated half, query i attends to key i - 2046: a stripe under the diagonal.
            rows = (3000, 3080)
            drag_box(page, [overview], T, rows, (rows[0] - PERIOD + 1, rows[1] - PERIOD + 1))
            page.mouse.up()  # releasing the box is the request
            moved = f"(text) => {{ const t = ({TITLE_WITH})(text); return !!t && !t.includes('queries 0-47'); }}"
            page.wait_for_function(moved, arg=f"head {head}: queries", timeout=120_000)
            settled(page, "the zoom")
            _no_exception(page, "the zoom")
            title = page.evaluate(TITLE_WITH, f"head {head}: queries")
            q0, q1, k0, k1 = (int(v) for v in re.search(r"queries (\d+)-(\d+), keys (\d+)-(\d+)", title).groups())
            assert 2950 <= q0 <= 3050 and 50 <= q1 - q0 < 128, title  # about the box: exact weights
            assert "zoom_q" in page.url, "the zoom is in the link"
            z = np.array(json.loads(page.evaluate(HEATMAP_Z, f"queries {q0}-{q1}")), dtype=float)
            assert z.shape == (q1 - q0 + 1, k1 - k0 + 1), z.shape
            peaks = k0 + z.argmax(axis=1)  # each query's strongest key in the box
            targets = np.arange(q0, q1 + 1) - PERIOD + 1
            inside = (targets >= k0) & (targets <= k1)
            assert inside.sum() >= 40, "the box holds the stripe"
            hits = (peaks[inside] == targets[inside]).mean()
            assert hits > 0.9, f"{hits:.2f} of the rows peak 2,046 tokens back"
            assert z[inside].max(axis=1).mean() > 0.3, "and the peaks are strong"
            zoom = page.locator(".js-plotly-plot").filter(has_text=f"queries {q0}-{q1}")
            zoom.first.screenshot(path=str(ARTIFACTS / "long-model-zoom.png"))
            page.goto(f"{server}/explorer?" + urlencode({**params, "view": "Head statistics"}))
            settled(page, "the probe's statistics")
            page.wait_for_selector("[data-testid='stDataFrame']", timeout=240_000)
            _no_exception(page, "the probe's statistics")
            errors = page.locator("[data-testid='stAlertContentError']").all_inner_texts()
            assert not errors, errors
            page.screenshot(path=str(ARTIFACTS / "long-model-statistics.png"))
        finally:
            browser.close()
