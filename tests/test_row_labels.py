"""The row labels of a long map stand apart: every n-th row is labelled once the rows outnumber the room.

The quick tests read the figure's own numbers (height, margins, tick font); the slow one draws the
figure with plotly.js in chromium and measures every label's box.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.figures.attention import attention_heatmap

SIZES = [3, 12, 30, 45, 80, 128]


def heatmap(Q: int, key_chars: int = 4):
    """A uniform causal map of Q rows: labels "q0", "q1", ... and keys of ``key_chars`` letters."""
    weights = np.tril(np.ones((Q, Q))) / np.arange(1, Q + 1)[:, None]
    keys = [f"{i}{'k' * key_chars}" for i in range(Q)]
    return attention_heatmap(weights, [f"q{i}" for i in range(Q)], keys, "decoder", mask=np.tril(np.ones((Q, Q), bool)))


@pytest.mark.parametrize("key_chars", [2, 30])
@pytest.mark.parametrize("Q", SIZES)
def test_each_row_label_has_the_height_of_its_font(Q, key_chars):
    fig = heatmap(Q, key_chars)
    layout, axis = fig.layout, fig.layout.yaxis
    rows_px = layout.height - layout.margin.t - layout.margin.b
    rows = list(fig.data[0].y)
    at = [rows.index(label) for label in axis.tickvals]
    labelled, step = len(at), (at[1] - at[0] if len(at) > 1 else Q)
    assert at == list(range(0, Q, step)), "every n-th row, from the first"
    assert rows_px / Q * step >= 1.2 * axis.tickfont.size, (Q, labelled, rows_px)  # a line of text, at least
    if rows_px / Q >= 1.4 * axis.tickfont.size:
        assert labelled == Q, "a map whose rows have the room labels every row"


@pytest.mark.parametrize("Q", SIZES)
def test_the_rooms_larger_labels_in_a_shorter_figure_still_have_their_height(Q, monkeypatch):
    """Presenter mode draws row labels at 18 px in at most 470 px: the rows chosen for 14 px are thinned again."""
    from attnviz.app import present

    monkeypatch.setattr(present, "presenting", lambda: True)
    before = heatmap(Q, 4)  # a sentence's pieces as keys
    fig = present.room(before)
    axis = fig.layout.yaxis
    rows_px = fig.layout.height - before.layout.margin.t * present.TICK_PX / 14 - fig.layout.margin.b
    rows = list(fig.data[0].y)
    at = [rows.index(label) for label in axis.tickvals]
    step = at[1] - at[0] if len(at) > 1 else Q
    assert at == list(range(0, Q, step)), "every n-th row, from the first"
    assert rows_px / Q * step >= 1.2 * present.TICK_PX, (Q, len(at), rows_px)
    if step > 1:  # a thinned axis names each labelled row by its position, as attnviz.figures.common.ticks does
        assert list(axis.ticktext) == list(axis.tickvals)


# The boxes of a drawn figure's y tick labels, top to bottom.
LABEL_BOXES = """() => [...document.querySelectorAll('.ytick text')].map(t => {
    const b = t.getBoundingClientRect(); return [b.top, b.bottom, t.textContent];
}).sort((a, b) => a[0] - b[0])"""


@pytest.mark.slow
def test_drawn_row_labels_never_overlap(tmp_path):
    from test_browser import CHROMIUM, CHROMIUM_ARGS, _need_browser

    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1000})
            for Q in SIZES:
                html = tmp_path / f"map-{Q}.html"
                html.write_text(heatmap(Q, 30).to_html(include_plotlyjs=True, full_html=True))
                page.goto(html.as_uri())
                page.wait_for_function(f"() => document.querySelectorAll('.ytick text').length >= {min(Q, 2)}")
                boxes = page.evaluate(LABEL_BOXES)
                assert boxes, Q
                for upper, lower in zip(boxes, boxes[1:], strict=False):
                    assert upper[1] <= lower[0] + 0.5, f"{Q} rows: {upper[2]!r} runs into {lower[2]!r}"
        finally:
            browser.close()
