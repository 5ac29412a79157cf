"""A phone's layout: the heatmap's narrow variant (plain figures), and the pages' order on a narrow screen (AppTest).

The real browser at 390x844 is tests/test_browser_phone.py; here the figure's settings and the
order of a page's blocks are checked without one.
"""

from __future__ import annotations

import html

import numpy as np
import pytest
from conftest import open_app

from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import (
    MODEBAR_PX,
    NARROW_KEY_CHARS,
    NARROW_KEY_LABELS,
    NARROW_ROW_CHARS,
    NARROW_TITLE_CHARS,
    plotly_labels,
    shortened,
    wrapped,
)
from attnviz.kinds import allowed, writing_labels

WORDS = ["<s>", "▁Donnerstag", ",", "▁2.", "▁Juli", "▁1998", "▁international", "</s>"]


def shown(text: list[str]) -> list[str]:
    """Tick texts as the browser shows them (plotly reads them as HTML)."""
    return [html.unescape(t) for t in text]


def cross_map(n_keys: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    keys = [WORDS[i % len(WORDS)] for i in range(n_keys)]
    reads = WORDS[:6]
    rows = writing_labels(reads, reads[1:] + ["</s>"])
    weights = rng.dirichlet(np.ones(n_keys), size=len(rows)).astype(np.float32)
    return weights, rows, keys


@pytest.mark.parametrize("n_keys", [8, 40])
def test_the_narrow_heatmap_cuts_labels_and_keeps_the_whole_ones_on_hover(n_keys):
    weights, rows, keys = cross_map(n_keys)
    fig = attention_heatmap(
        weights, rows, keys, "cross", "Cross-attention (encoder-decoder), layer 3, head 1", narrow=True
    )
    data = fig.data[0]
    # hover and the categories hold the whole position labels, exactly as in the wide figure
    wide = attention_heatmap(weights, rows, keys, "cross", "Cross-attention (encoder-decoder), layer 3, head 1")
    assert list(data.x) == list(wide.data[0].x) == plotly_labels(keys)
    assert list(data.y) == list(wide.data[0].y) == plotly_labels(rows)
    np.testing.assert_array_equal(data.z, wide.data[0].z)
    x_text, y_text = shown(fig.layout.xaxis.ticktext), shown(fig.layout.yaxis.ticktext)
    assert max(len(t) for t in x_text) <= NARROW_KEY_CHARS
    assert max(len(t) for t in y_text) <= NARROW_ROW_CHARS
    assert len(y_text) == len(rows), "every row keeps its label"
    assert len(x_text) <= NARROW_KEY_LABELS, "at most this many key labels share a phone's width"
    step = -(-n_keys // NARROW_KEY_LABELS)
    assert list(fig.layout.xaxis.tickvals) == plotly_labels(keys)[::step]
    for full, cut in zip(
        [html.unescape(v) for v in fig.layout.yaxis.tickvals], y_text, strict=True
    ):  # each cut label is the start of its token's text, "…" marking the cut
        token = full.split(" ", 1)[1]
        assert cut == token or (cut.endswith("…") and token.startswith(cut[:-1])), (full, cut)
    assert fig.layout.xaxis.tickangle == -90, "upright key labels: each takes its column's width"
    assert data.colorbar.orientation == "h", "the colour bar lies under the map, not beside it"
    title = fig.layout.title
    assert all(len(line) <= NARROW_TITLE_CHARS for line in title.text.split("<br>"))
    assert title.pad.t >= MODEBAR_PX, "the title starts below plotly's toolbar"


def test_a_long_narrow_map_labels_no_more_rows_than_have_room():
    rng = np.random.default_rng(1)
    Q = 120
    tokens = [WORDS[i % len(WORDS)] for i in range(Q)]
    weights = rng.dirichlet(np.ones(Q), size=Q).astype(np.float32)
    fig = attention_heatmap(weights, tokens, tokens, "encoder", narrow=True)
    rows_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    labels = len(fig.layout.yaxis.ticktext)
    assert 2 <= labels < Q
    # a 12 px label's box is 16 px tall in chromium (tests/test_browser_phone.py reads the boxes)
    assert rows_px / labels >= 16, f"{labels} labels of 12 px in {rows_px} px pile up"


def test_the_wide_heatmap_is_unchanged_by_the_narrow_variant():
    weights, rows, keys = cross_map(8)
    fig = attention_heatmap(weights, rows, keys, "cross", "A title", mask=allowed("cross", *weights.shape))
    assert fig.layout.xaxis.tickangle is None and list(fig.layout.xaxis.autotickangles) == [0, -60]
    assert fig.data[0].colorbar.orientation is None
    assert shown(fig.layout.xaxis.ticktext) == [k for k in keys], "whole tokens on a wide screen"
    assert fig.layout.title.text == "A title" and fig.layout.title.pad.t == 12


@pytest.mark.parametrize(
    ("label", "chars", "expected"),
    [
        ("0 &lt;s&gt; → ▁Donnerstag", 8, "0 <s> →…"),
        ("&lt;s&gt;", 3, "<s>"),  # escapes count as the one character they show
        ("▁Donnerstag", 6, "▁Donn…"),
        ("ab", 6, "ab"),
    ],
)
def test_shortened_counts_what_is_shown(label, chars, expected):
    cut = shortened(label, chars)
    assert html.unescape(cut) == expected
    assert "<" not in cut, "still escaped for plotly"


def test_wrapped_breaks_at_spaces_and_keeps_every_word():
    title = "Cross-attention (encoder-decoder), layer 3, head 1: queries 100-130, keys 0-127"
    lines = wrapped(title, 34).split("<br>")
    assert " ".join(lines) == title
    assert all(len(line) <= 34 for line in lines) and len(lines) == 3


@pytest.mark.slow  # AppTest runs the page: a few seconds
@pytest.mark.usefixtures("fresh_streamlit_caches")
@pytest.mark.parametrize("page", ["app.py", "pages/explorer.py"])
def test_on_a_narrow_screen_the_chart_follows_the_title(page):
    from streamlit.testing.v1 import AppTest

    from attnviz.app.viewport import NARROW

    def first_after_title(at: AppTest):
        blocks = list(at.main.children.values())
        after = blocks[[b.type for b in blocks].index("title") + 1]
        return after, [c.type for c in getattr(after, "children", {}).values()]

    wide = open_app(page)
    narrow = AppTest.from_file("../app.py", default_timeout=120)
    narrow.session_state[NARROW] = True  # what the browser's report sets (attnviz.app.viewport)
    narrow.run()
    if page != "app.py":
        narrow.switch_page(page).run()
    assert not narrow.exception and not wide.exception
    after, inside = first_after_title(narrow)
    assert inside and inside[0] == "plotly_chart", inside
    assert '"tickangle":-90' in narrow.get("plotly_chart")[0].proto.spec
    after, inside = first_after_title(wide)
    assert not inside or inside[0] != "plotly_chart", "a wide screen keeps its order"
    assert '"tickangle":-90' not in wide.get("plotly_chart")[0].proto.spec
