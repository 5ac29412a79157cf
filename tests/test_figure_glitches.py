"""Figures a room reads from the back ("Lecture-ready"): named legends, labels that are never cut
off and never print over each other, and text of at least 14 px in a dark colour.
"""

from __future__ import annotations

import html
import itertools

import numpy as np
import pytest

from attnviz.figures.atlas import head_map
from attnviz.figures.embedding import hover_only, place_labels, qk_scatter
from attnviz.figures.walkthrough import feed_arrow
from attnviz.qk import qk_embedding

# Our own estimate of rendered text, independent of the figures' constants: plotly's default font
# averages about 0.55 em a character; 0.6 leaves room.
CHAR_EM, LINE_EM = 0.6, 1.2


def is_dark(colour: str) -> bool:
    """Whether a '#rrggbb' colour is dark enough to read on white from afar."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 80


def embedding(n_queries: int, n_keys: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return qk_embedding(rng.normal(size=(n_queries, 8)), rng.normal(size=(n_keys, 8)))


# ---------------------------------------------------------------------------------------------
# Q-K scatter


def test_qk_legend_says_queries_and_keys_and_every_point_has_its_token():
    tokens = ["<s>", "▁the", "▁cat", "</s>"]
    fig = qk_scatter(embedding(4, 4), tokens, tokens, "encoder")
    queries, keys = fig.data
    assert queries.name.startswith("queries (") and keys.name.startswith("keys ("), "not 'querys'"
    for trace, role in ((queries, "query"), (keys, "key")):
        assert "text" in trace.mode
        assert [html.unescape(t) for t in trace.text] == tokens, "each point shows its token, escaped for plotly"
        assert trace.textfont.size >= 14 and is_dark(trace.textfont.color)
        assert "%{hovertext}" in trace.hovertemplate
        assert list(trace.hovertext) == [f"{role}, position {i}: {html.escape(t)}" for i, t in enumerate(tokens)]
    assert queries.textposition != keys.textposition, "query i and key i put their tokens on opposite sides"
    assert fig.layout.font.size >= 14 and is_dark(fig.layout.font.color)


def test_qk_long_inputs_keep_tokens_in_the_hover_only():
    tokens = [f"t{i}" for i in range(60)]
    queries, keys = qk_scatter(embedding(60, 60), tokens, tokens, "cross", colour_by="role").data
    for trace, role in ((queries, "query"), (keys, "key")):
        assert trace.mode == "markers" and trace.text is None
        assert trace.hovertext[59] == f"{role}, position 59: t59"


def _drawn_boxes(points, texts, places, px):
    """Our own boxes of the placed tokens, from plotly's meaning of each text position (y upwards, px)."""
    r, height = 9 / 2 + 2, LINE_EM * px
    boxes = []
    for trace, tokens, where in zip(points, texts, places, strict=True):
        for (x, y), token, place in zip(trace, tokens, where, strict=True):
            if place is None:
                continue
            width = CHAR_EM * px * len(token)
            vertical, horizontal = place.split()
            x0 = {"center": x - width / 2, "right": x + r if vertical == "middle" else x}.get(horizontal)
            if horizontal == "left":
                x0 = x - width - (r if vertical == "middle" else 0)
            y0 = {"top": y + r, "bottom": y - r - height, "middle": y - height / 2}[vertical]
            boxes.append((token, x0, x0 + width, y0, y0 + height))
    return boxes


@pytest.mark.parametrize("seed", range(3))
def test_qk_tokens_are_placed_apart_or_left_to_the_hover(seed):
    rng = np.random.default_rng(seed)
    points = [rng.uniform(0, 300, size=(25, 2)), rng.uniform(0, 300, size=(25, 2))]
    texts = [[f"q{i}" * (1 + i % 3) for i in range(25)], [f"key{i}" for i in range(25)]]
    places = place_labels(points, texts, ["top center", "bottom center"], 14, bounds=(-50, 350, -50, 350))
    boxes = _drawn_boxes(points, texts, places, 14)
    for (s, *a), (t, *b) in itertools.combinations(boxes, 2):
        assert not (a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]), f"{s!r} and {t!r} overlap"
    assert len(boxes) >= 25, "at most half of the tokens go to the hover on a 300 px square"
    assert all(-50 <= b[1] and b[2] <= 350 and -50 <= b[3] and b[4] <= 350 for b in boxes), "inside the bounds"


def test_qk_tokens_with_room_keep_their_first_places_and_crowded_ones_go_to_the_hover():
    apart = [np.array([[0.0, 0.0], [200.0, 0.0]]), np.array([[0.0, 100.0], [200.0, 100.0]])]
    texts = [["a", "b"], ["c", "d"]]
    places = place_labels(apart, texts, ["top center", "bottom center"], 14, bounds=(-100, 300, -100, 200))
    assert places == [["top center", "top center"], ["bottom center", "bottom center"]]
    same = [np.zeros((6, 2)), np.zeros((6, 2))]  # twelve tokens at one spot: eight places around it
    places = place_labels(same, [["word"] * 6] * 2, ["top center", "bottom center"], 14, bounds=(-99, 99, -99, 99))
    assert 0 < sum(p is not None for trace in places for p in trace) <= 8
    # Exactly one spot: points 1e-3 apart (an earlier input) fall where the SVD's basis of equal singular
    # values puts them, which differs between CPUs (apart on a Xeon with AMX, crowded on an AVX2 EPYC).
    e = qk_embedding(np.zeros((6, 8)), np.zeros((6, 8)))
    tokens = [f"token{i}" for i in range(6)]
    fig = qk_scatter(e, tokens, tokens, "encoder")
    hidden = hover_only(fig)
    assert 0 < hidden < 12, "points on top of each other: some tokens drawn, the others on hover"
    assert all(len(trace.hovertext) == 6 for trace in fig.data), "every point keeps its token on hover"


def test_qk_on_a_phone_wraps_its_title_and_lays_its_colour_bar_across_the_foot():
    tokens = ["<s>", "▁the", "▁cat", "▁sat", "</s>"]
    wide = qk_scatter(
        embedding(5, 5), tokens, tokens, "cross", title="Cross-attention (encoder-decoder), layer 3, head 4"
    )
    fig = qk_scatter(
        embedding(5, 5),
        tokens,
        tokens,
        "cross",
        title="Cross-attention (encoder-decoder), layer 3, head 4",
        narrow=True,
    )
    assert "<br>" in fig.layout.title.text and all(len(line) <= 34 for line in fig.layout.title.text.split("<br>"))
    assert not fig.layout.title.subtitle.text, "the page's caption says what the subtitle would"
    assert wide.layout.title.subtitle.text and "<br>" not in wide.layout.title.text
    (bar,) = [t.marker.colorbar for t in fig.data if t.marker.showscale]
    assert bar.orientation == "h", "the colour bar lies across the foot: the plot keeps the phone's width"
    assert all(t.textfont.size == 12 for t in fig.data)


def test_qk_ranges_leave_room_for_the_outermost_tokens():
    e = embedding(5, 5, seed=3)
    fig = qk_scatter(e, list("abcde"), list("abcde"), "encoder")
    (x0, x1), (y0, y1) = fig.layout.xaxis.range, fig.layout.yaxis.range
    low, high = e.points.min(axis=0), e.points.max(axis=0)
    assert x0 < low[0] and x1 > high[0] and y0 < low[1] and y1 > high[1]


# ---------------------------------------------------------------------------------------------
# The walkthrough's arrow (stage 5c: memory feeds cross-attention's K and V)

STAGE_5C = (
    "memory (encoder layer 6 output + final LayerNorm), source position x d_model",
    "K and V of decoder layer 6's cross-attention",
)


@pytest.mark.parametrize("texts", [STAGE_5C, ("memory", "K, V"), ("x" * 90, "a " * 70)])
def test_arrow_labels_fit_their_boxes_and_the_figure(texts):
    """Plotly clips an annotation's text at its box's width: every line must fit, and every box the figure."""
    fig = feed_arrow(*texts)
    boxes = [a for a in fig.layout.annotations if a.text]
    assert len(boxes) == 2
    margin = fig.layout.margin
    plot_px = fig.layout.height - margin.t - margin.b
    for box, text in zip(boxes, texts, strict=True):
        lines = [html.unescape(line) for line in box.text.split("<br>")]
        assert "".join(lines).replace(" ", "") == text.replace(" ", ""), "wrapping loses no text"
        size = box.font.size
        longest_px = max(len(line) for line in lines) * CHAR_EM * size
        assert longest_px <= box.width, f"a line of {longest_px:.0f} px is clipped in a {box.width} px box"
        assert size >= 14 and is_dark(box.font.color)
        pad = box.borderpad + box.borderwidth
        assert len(lines) * LINE_EM * size + 2 * pad <= plot_px, "the box is taller than the figure"
    # the boxes start at the plot's edges and grow inwards: none reaches past the figure
    (left, right), x_range = boxes, fig.layout.xaxis.range
    assert (left.x, left.xanchor) == (x_range[0], "left") and (right.x, right.xanchor) == (x_range[1], "right")


# ---------------------------------------------------------------------------------------------
# The atlas's head map

# In shares of an axis's range (a 380-400 px map): a name like "L3H2" is about 0.07 wide and 0.04
# tall, and sits about 0.04 above or below its point.
NAME_W, NAME_H, NAME_OFFSET = 0.07, 0.04, 0.04


def shown_names(fig) -> list[tuple[str, float, float]]:
    """(name, centre x, centre y) of every name the map prints, in shares of its axes' ranges.

    Without explicit ranges, plotly's autorange is about the points' extent (equal on both axes).
    """
    xs, ys = (np.concatenate([np.asarray(getattr(t, a), dtype=float) for t in fig.data]) for a in "xy")
    span = max(np.ptp(xs), np.ptp(ys))
    (x0, x1) = fig.layout.xaxis.range or (xs.min(), xs.min() + span)
    (y0, y1) = fig.layout.yaxis.range or (ys.min(), ys.min() + span)
    shown = []
    for trace in fig.data:
        if trace.text is None:
            continue
        places = trace.textposition if isinstance(trace.textposition, tuple) else [trace.textposition] * len(trace.x)
        for name, x, y, place in zip(trace.text, trace.x, trace.y, places, strict=True):
            if name:
                side = 1 if place.startswith("top") else -1 if place.startswith("bottom") else 0
                shown.append((name, (x - x0) / (x1 - x0), (y - y0) / (y1 - y0) + side * NAME_OFFSET))
    return shown


def crowded_map(selected=(4, 3)):
    """48 heads: a tight cluster of 24 (as in a trained model, where many heads attend alike) and 24 apart."""
    rng = np.random.default_rng(1)
    layers, heads = (a.ravel() for a in np.meshgrid(np.arange(1, 7), np.arange(1, 9), indexing="ij"))
    x, y = rng.normal(size=48), rng.normal(size=48)
    x[:24], y[:24] = rng.normal(size=24) * 0.02, rng.normal(size=24) * 0.02
    values = rng.uniform(0, 2, size=48)
    values[5] = np.nan  # one head drawn grey: its name is placed with everyone else's
    return head_map(layers, heads, x, y, values, "entropy", "encoder", selected=selected)


def test_head_names_do_not_print_over_each_other():
    shown = shown_names(crowded_map())
    assert len(shown) >= 10, "the heads apart from the cluster keep their names"
    for (a, ax, ay), (b, bx, by) in itertools.combinations(shown, 2):
        assert abs(ax - bx) >= NAME_W or abs(ay - by) >= NAME_H, f"{a} and {b} overlap"


def test_the_selected_head_is_named_and_every_head_is_in_the_hover():
    fig = crowded_map(selected=(1, 2))  # inside the cluster
    assert "L1H2" in [name for name, _, _ in shown_names(fig)]
    named = {tuple(c) for trace in fig.data if trace.customdata is not None for c in trace.customdata}
    assert len(named) == 48 and all("customdata[0]" in t.hovertemplate for t in fig.data if t.customdata is not None)


def test_head_map_text_is_readable_from_the_back():
    fig = crowded_map()
    assert fig.layout.font.size >= 14 and is_dark(fig.layout.font.color), "tick labels and titles"
    for trace in fig.data:
        if trace.text is not None:
            assert trace.textfont.size >= 14 and is_dark(trace.textfont.color)
