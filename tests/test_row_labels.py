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
def test_the_room_thins_a_long_maps_row_labels_and_keeps_a_sentences(Q, monkeypatch):
    """Presenter mode draws row labels at 18 px in at most 470 px: a long map's rows are thinned again, every
    n-th from the first and named by position; a sentence's dozen rows keep every label (the drawn
    labels are measured by the slow test below)."""
    from attnviz.app import present

    monkeypatch.setattr(present, "presenting", lambda: True)
    fig = present.room(heatmap(Q, 4))  # a sentence's pieces as keys
    axis = fig.layout.yaxis
    rows = list(fig.data[0].y)
    at = [rows.index(label) for label in axis.tickvals]
    step = at[1] - at[0] if len(at) > 1 else Q
    assert at == list(range(0, Q, step)), "every n-th row, from the first"
    if Q <= 12:
        assert step == 1, f"{Q} rows: a sentence keeps every row's label"
    if Q >= 45:
        assert step > 1, f"{Q} rows cannot all be labelled at 18 px in 470 px"
    if step > 1:  # a thinned axis names each labelled row by its position, as attnviz.figures.common.ticks does
        assert list(axis.ticktext) == list(axis.tickvals)


def test_thinned_rows_keep_their_positions_though_a_long_token_is_cut(monkeypatch):
    """A 300-letter token's tick is cut ("…"); thinned in presenter mode, the rows are still named by position
    (a review found them named by the cut tokens alone, their positions gone)."""
    from attnviz.app import present
    from attnviz.figures.common import MAX_TICK_CHARS

    monkeypatch.setattr(present, "presenting", lambda: True)
    Q = 60
    weights = np.tril(np.ones((Q, Q))) / np.arange(1, Q + 1)[:, None]
    rows = [f"▁w{i}" if i else "▁" + "w" * 300 for i in range(Q)]
    fig = present.room(attention_heatmap(weights, rows, rows, "decoder", mask=np.tril(np.ones((Q, Q), bool))))
    axis = fig.layout.yaxis
    assert len(axis.tickvals) < Q, "thinned"
    assert all(text.split(" ", 1)[0].isdigit() for text in axis.ticktext), list(axis.ticktext)[:3]
    assert max(len(text) for text in axis.ticktext) <= MAX_TICK_CHARS


# The boxes of a drawn figure's y tick labels, top to bottom.
LABEL_BOXES = """() => [...document.querySelectorAll('.ytick text')].map(t => {
    const b = t.getBoundingClientRect(); return [b.top, b.bottom, t.textContent];
}).sort((a, b) => a[0] - b[0])"""


def figure(Q: int, room: bool):
    """The map of `heatmap` (long keys), or as presenter mode draws it (a sentence's short keys, 18 px)."""
    if not room:
        return heatmap(Q, 30)
    from attnviz.app import present

    before, present.presenting = present.presenting, lambda: True
    try:
        return present.room(heatmap(Q, 4))
    finally:
        present.presenting = before


# One page holds plotly.js (the first figure's own HTML); each figure after it is drawn anew in the same
# div, as that HTML draws it, rather than loading 3.5 MB of plotly.js again for every figure.
DRAW = """fig => {
    const div = document.querySelector('.plotly-graph-div');
    Plotly.purge(div);
    return Plotly.newPlot(div, fig.data, fig.layout, {responsive: true}).then(() => true);
}"""


@pytest.mark.slow
def test_drawn_row_labels_never_overlap(tmp_path):
    import json

    from test_browser import CHROMIUM, CHROMIUM_ARGS, _need_browser

    _need_browser()
    from playwright.sync_api import sync_playwright

    cases = [(Q, False) for Q in SIZES] + [(Q, True) for Q in SIZES]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1000})
            for i, (Q, room) in enumerate(cases):
                fig = figure(Q, room)
                if i == 0:
                    html = tmp_path / "map.html"
                    html.write_text(fig.to_html(include_plotlyjs=True, full_html=True))
                    page.goto(html.as_uri())
                else:
                    assert page.evaluate(DRAW, json.loads(fig.to_json()))
                page.wait_for_function(f"() => document.querySelectorAll('.ytick text').length >= {min(Q, 2)}")
                boxes = page.evaluate(LABEL_BOXES)
                assert boxes, Q
                for upper, lower in zip(boxes, boxes[1:], strict=False):
                    assert upper[1] <= lower[0] + 0.5, f"{Q} rows (room: {room}): {upper[2]!r} runs into {lower[2]!r}"
        finally:
            browser.close()
