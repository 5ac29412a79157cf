"""Figure builders: each figure holds exactly the numbers it claims to show, with unique, ordered labels.

Arrays are compared on ``fig.data[i].z`` (numpy) rather than the JSON, where plotly encodes them as
base64 typed arrays.
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
import pytest

from attnviz.figures.attention import attention_heatmap, lines_view
from attnviz.figures.common import (
    HIGHLIGHT,
    MAX_TICK_LABELS,
    export_config,
    kind_titles,
    plotly_labels,
    position_labels,
)
from attnviz.figures.decoding import step_rows_grid, topk_bar
from attnviz.figures.images import head_grid

L, H, T, S = 3, 4, 5, 7
SRC = ["▁the", "▁cat", "▁sat", "▁on", "▁the", "▁mat", "</s>"]  # "▁the" twice
TGT = ["<s>", "▁die", "▁Katze", "▁saß", "▁die"]


def random_maps(*shape: int, seed: int = 0) -> np.ndarray:
    """Random post-softmax-like maps: positive, rows sum to 1, not symmetric."""
    rng = np.random.default_rng(seed)
    maps = rng.random(shape).astype(np.float32) ** 3
    return maps / maps.sum(-1, keepdims=True)


@pytest.fixture
def cross() -> np.ndarray:
    return random_maps(L, H, T, S)  # (L, H, T, S): target rows, source columns


def test_labels_are_unique_and_escaped():
    tokens = ["▁the", "▁cat", "▁the", "</s>"]
    assert position_labels(tokens) == ["0 ▁the", "1 ▁cat", "2 ▁the", "3 </s>"]
    # plotly reads "<s>" as strike-through: the escaped form is what it displays as "3 </s>".
    assert plotly_labels(tokens) == ["0 ▁the", "1 ▁cat", "2 ▁the", "3 &lt;/s&gt;"]


def test_cross_heatmap_holds_the_slice_with_target_rows_and_source_columns(cross):
    fig = attention_heatmap(cross[1, 2], TGT, SRC, "cross", title="layer 2, head 3")
    z = fig.data[0].z
    assert z.shape == (T, S)
    np.testing.assert_array_equal(z, cross[1, 2])
    assert list(fig.data[0].y) == plotly_labels(TGT) and list(fig.data[0].x) == plotly_labels(SRC)
    assert list(fig.layout.yaxis.tickvals) == plotly_labels(TGT)  # hover names the position
    assert list(fig.layout.yaxis.ticktext) == ["&lt;s&gt;", *TGT[1:]]  # the tick, the token alone
    assert list(fig.layout.xaxis.ticktext) == [t.replace("</s>", "&lt;/s&gt;") for t in SRC]
    assert (fig.layout.xaxis.type, fig.layout.yaxis.type) == ("category", "category")
    assert fig.layout.yaxis.title.text == kind_titles("cross")[1] and "query" in fig.layout.yaxis.title.text
    assert fig.layout.xaxis.title.text == kind_titles("cross")[2] and "key" in fig.layout.xaxis.title.text
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0.0, 1.0)
    assert ".6f" in fig.data[0].hovertemplate and "query %{y}" in fig.data[0].hovertemplate
    assert len(fig.data) == 1  # nothing masked: no mask trace


def test_repeated_tokens_keep_distinct_ticks_in_order():
    tokens = ["▁the", "▁cat", "▁the", "</s>"]
    fig = attention_heatmap(random_maps(4, 4), tokens, tokens, "encoder")
    categories = list(fig.layout.xaxis.tickvals)
    assert len(set(categories)) == 4 and categories == plotly_labels(tokens) == list(fig.data[0].x)
    assert list(fig.layout.yaxis.tickvals) == list(fig.data[0].y) == plotly_labels(tokens)
    assert list(fig.layout.xaxis.ticktext) == ["▁the", "▁cat", "▁the", "&lt;/s&gt;"], "no position before a token"


def test_a_very_long_token_is_cut_in_its_tick_and_kept_whole_in_the_hover():
    """A 10,000-letter word the tokenizer cannot read is one token: its tick would have pushed the map out of
    the figure (a left margin of 71,722 px asked for, an audit). Ticks show at most MAX_TICK_CHARS."""
    from attnviz.app.margins import _left
    from attnviz.figures.common import MAX_TICK_CHARS

    tokens = ["<unk:" + "a" * 10_000 + ">", "▁b"]
    fig = attention_heatmap(random_maps(2, 2), tokens, tokens, "encoder")
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        shown = [html.unescape(text) for text in axis.ticktext]  # as plotly shows them
        assert max(map(len, shown)) <= MAX_TICK_CHARS and shown[0].endswith("…"), shown
    assert list(fig.data[0].y) == plotly_labels(tokens), "the hover names the whole token"
    assert _left(fig.layout.yaxis.to_plotly_json()) < 600


def test_digit_tokens_are_not_read_as_positions():
    """'4 2' (position 4, token 2) read as one number; the tick shows '2', hover '4 2'."""
    tokens = ["▁", "2", "1", "9"]
    fig = attention_heatmap(random_maps(4, 4), tokens, tokens, "encoder")
    assert list(fig.layout.xaxis.ticktext) == ["␣", "2", "1", "9"], "a lone word marker shows as a space"
    assert fig.layout.xaxis.tickangle is None and list(fig.layout.xaxis.autotickangles) == [0, -60], "flat if they fit"
    assert fig.layout.xaxis.tickfont.size >= 14 and fig.layout.xaxis.tickfont.color == "#1a1a1a"


def test_decoder_rows_are_named_by_what_they_write():
    from attnviz.export import AttentionExport
    from attnviz.kinds import writing_labels

    export = AttentionExport(
        encoder=random_maps(1, 1, 3, 3),
        decoder=random_maps(1, 1, 3, 3),
        cross=random_maps(1, 1, 3, 3),
        src_ids=np.arange(3),
        tgt_ids=np.arange(3),
        src_tokens=("▁six", "▁hundred", "</s>"),
        tgt_tokens=("<s>", "▁sechs", "hundert"),
        manifest={},
    )
    assert export.writes() == ("▁sechs", "hundert", "</s>")
    assert writing_labels(export.tgt_tokens, export.writes())[1] == "▁sechs → hundert"
    assert export.tokens("cross") == (export.tgt_tokens, export.src_tokens)
    assert export.tokens("decoder") == (export.tgt_tokens, export.tgt_tokens)
    cut = AttentionExport(**{**export.__dict__, "manifest": {"tgt_truncated": True}})
    assert cut.writes()[-1] == "…", "an output cut at the length limit: the last token written is unknown"


def test_masked_cells_are_nan_and_grey_while_true_zeros_stay_zero():
    weights = np.tril(random_maps(4, 4, seed=1))
    weights[2, 1] = 0.0  # a learned zero the model was allowed to attend to
    mask = np.tril(np.ones((4, 4), dtype=bool))
    fig = attention_heatmap(weights, TGT[:4], TGT[:4], "decoder", mask=mask)
    z = fig.data[0].z
    assert np.isnan(z[~mask]).all()
    assert z[2, 1] == 0.0
    np.testing.assert_array_equal(z[mask], weights[mask])
    grey = fig.data[1]
    assert grey.name == "masked" and "masked" in grey.hovertemplate and not grey.showscale
    np.testing.assert_array_equal(~np.isnan(grey.z), ~mask)  # grey exactly where masked
    assert {c for _, c in grey.colorscale} == {fig.layout.plot_bgcolor}


def test_mask_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="mask"):
        attention_heatmap(random_maps(4, 4), TGT[:4], TGT[:4], "decoder", mask=np.ones((3, 4), dtype=bool))
    with pytest.raises(ValueError, match="kind"):
        attention_heatmap(random_maps(4, 4), TGT[:4], TGT[:4], "self")


def test_scores_mode_is_diverging_around_zero_and_masks_minus_infinity():
    rng = np.random.default_rng(2)
    scores = (rng.standard_normal((4, 4)) * 3).astype(np.float32)
    scores[np.triu_indices(4, k=1)] = -np.inf
    fig = attention_heatmap(scores, TGT[:4], TGT[:4], "decoder", scores=True)
    trace = fig.data[0]
    assert trace.zmid == 0.0 and trace.zmin is None and trace.zmax is None
    assert trace.colorscale == go.Heatmap(colorscale="RdBu_r").colorscale
    assert trace.colorbar.title.text == "score" and "score %{z:.6f}" in trace.hovertemplate
    future = np.triu(np.ones((4, 4), dtype=bool), k=1)
    assert np.isnan(trace.z[future]).all()
    np.testing.assert_array_equal(trace.z[~future], scores[~future])
    np.testing.assert_array_equal(~np.isnan(fig.data[1].z), future)


def test_long_axes_thin_the_labels_but_keep_every_value():
    n = 200
    weights = random_maps(n, n, seed=3)
    fig = attention_heatmap(weights, ["▁a"] * n, ["▁b"] * n, "encoder")
    np.testing.assert_array_equal(fig.data[0].z, weights)
    ticks = list(fig.layout.xaxis.ticktext)
    assert len(ticks) <= MAX_TICK_LABELS and ticks[:2] == ["0 ▁b", "3 ▁b"]
    assert len(fig.data[0].x) == n


def drawn_lines(fig: go.Figure) -> dict[tuple[int, int, int], tuple[float, str]]:
    """Every line of a lines view read from its points: (head, query, key) -> (opacity, hover text).

    A line is three points (query end, midpoint, key end) and a gap; each is drawn once."""
    found = {}
    for t in fig.data:
        if not t.meta:
            continue
        assert len(t.x) == len(t.y) == len(t.hovertext) == 4 * len(t.meta["lines"])
        for j, (q, k) in enumerate(t.meta["lines"]):
            x, y = t.x[4 * j : 4 * j + 4], t.y[4 * j : 4 * j + 4]
            assert tuple(x) == (0.0, 0.5, 1.0, None) and tuple(y) == (q, (q + k) / 2, k, None)
            text = t.hovertext[4 * j]
            assert t.hovertext[4 * j + 1] == t.hovertext[4 * j + 2] == text and t.hovertext[4 * j + 3] == ""
            key = (t.meta["head"], q, k)
            assert key not in found, f"{key} drawn twice"
            found[key] = (t.opacity, text)
    return found


def test_lines_view_draws_one_line_per_weight_above_threshold(cross):
    heads = [1, 3]
    chosen = cross[1][[h - 1 for h in heads]]  # layer 2, heads 1 and 3: (2, T, S)
    fig = lines_view(chosen, TGT, SRC, heads, "cross", threshold=0.05, layer=2)
    assert fig.layout.title.text.endswith("layer 2, heads 1, 3"), fig.layout.title.text
    lines = drawn_lines(fig)
    expected = {(heads[i], q, k): chosen[i, q, k] for i, q, k in zip(*np.nonzero(chosen >= 0.05), strict=True)}
    assert set(lines) == set(expected) and len(expected) > 0
    for (head, q, k), (opacity, text) in lines.items():
        weight = float(expected[head, q, k])
        # the weight to the nearest 1/64, at least 1/64
        assert opacity == pytest.approx(max(1, round(weight * 64)) / 64) and abs(opacity - weight) <= 1 / 128 + 1e-9
        words = f"head {head}<br>query {plotly_labels(TGT)[q]}<br>key {plotly_labels(SRC)[k]}"
        assert text == f"{words}<br>weight {weight:.6f}"
    traces = [t for t in fig.data if t.meta]
    for t in traces:  # one head and one opacity a trace: no two traces share both
        assert {lines[t.meta["head"], q, k][0] for q, k in t.meta["lines"]} == {t.opacity}
    assert len({(t.meta["head"], t.opacity) for t in traces}) == len(traces) < len(lines)
    colours = {t.meta["head"]: t.line.color for t in traces}
    assert len(set(colours.values())) == len(heads)
    assert [t.name for t in fig.data if t.showlegend is not False and t.mode == "lines"] == ["head 1", "head 3"]
    texts = [t for t in fig.data if t.mode == "text"]
    assert list(texts[0].text) == plotly_labels(TGT) and list(texts[1].text) == plotly_labels(SRC)
    annotations = " ".join(a.text for a in fig.layout.annotations)
    assert "queries" in annotations and "keys" in annotations
    opacities = [t.opacity for t in traces]
    assert opacities == sorted(opacities)  # strongest drawn last, on top


def test_lines_view_keeps_the_strongest_lines_when_capped(cross):
    fig = lines_view(cross[0], TGT, SRC, [1, 2, 3, 4], "cross", threshold=0.0, max_lines=10)
    lines = drawn_lines(fig)
    strongest = np.argsort(cross[0].ravel(), kind="stable")[-10:]
    assert set(lines) == {(h + 1, q, k) for h, q, k in zip(*np.unravel_index(strongest, cross[0].shape), strict=True)}
    assert "10 strongest" in fig.layout.title.subtitle.text


def test_lines_view_with_no_weight_above_the_threshold_draws_only_the_heads_legend():
    fig = lines_view(np.full((2, 3, 3), 1 / 3), ["a"] * 3, ["b"] * 3, [2, 5], "encoder", threshold=0.9)
    assert drawn_lines(fig) == {}
    assert [t.name for t in fig.data if t.mode == "lines"] == ["head 2", "head 5"]


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_lines_view_draws_thousands_of_lines_in_a_few_traces_a_head():
    """A long sentence's heads: thousands of lines, at most 64 traces a head, each line once."""
    maps = random_maps(6, 40, 40, seed=12)  # (heads, Q, K)
    fig = lines_view(maps, ["q"] * 40, ["k"] * 40, list(range(1, 7)), "encoder", threshold=0.0, max_lines=10_000)
    lines = drawn_lines(fig)
    assert len(lines) == maps.size
    assert len([t for t in fig.data if t.meta]) <= 64 * 6
    for (head, q, k), (opacity, _) in lines.items():
        assert abs(opacity - maps[head - 1, q, k]) <= 1 / 128 + 1e-9 or opacity == 1 / 64


def test_topk_bar_puts_the_most_likely_on_top_and_highlights_the_chosen():
    fig = topk_bar(["▁a", "▁b", "</s>", "▁c"], [0.1, 0.6, 0.25, 0.05], chosen="</s>")
    bar = fig.data[0]
    assert list(bar.y) == ["1 ▁b", "2 &lt;/s&gt;", "3 ▁a", "4 ▁c"]
    np.testing.assert_allclose(bar.x, [0.6, 0.25, 0.1, 0.05])
    assert fig.layout.yaxis.autorange == "reversed"  # first category at the top
    assert [c == HIGHLIGHT for c in bar.marker.color] == [False, True, False, False]
    assert fig.layout.xaxis.title.text == "probability" and tuple(fig.layout.xaxis.range) == (0.0, 1.0)
    missing = topk_bar(["▁a", "▁b"], [0.3, 0.7], chosen="▁z")
    assert "not in the top 2" in missing.layout.title.text
    assert HIGHLIGHT not in missing.data[0].marker.color


def test_step_rows_grid_stacks_layers_and_heads(cross):
    rows = cross[:, :, 3]  # (L, H, S): every layer's and head's cross-attention row of query 3
    fig = step_rows_grid(rows, SRC, "step 3")
    trace = fig.data[0]
    assert trace.z.shape == (L * H, S)
    assert list(trace.y)[: H + 1] == [f"layer 1 head {h}" for h in range(1, H + 1)] + ["layer 2 head 1"]
    np.testing.assert_array_equal(trace.z[(2 - 1) * H + (3 - 1)], cross[1, 2, 3])
    assert list(fig.layout.xaxis.tickvals) == plotly_labels(SRC)
    assert (trace.zmin, trace.zmax) == (0.0, 1.0) and fig.layout.title.text == "step 3"
    assert "key" in fig.layout.xaxis.title.text and "query" in fig.layout.yaxis.title.text


def test_step_rows_grid_takes_torch_tensors(cross):
    torch = pytest.importorskip("torch")
    fig = step_rows_grid(torch.from_numpy(cross[:, :, 0]), SRC, "step 0")
    np.testing.assert_array_equal(fig.data[0].z, cross[:, :, 0].reshape(L * H, S))


def test_export_config_downloads_the_named_format():
    assert export_config("attention", "svg") == {
        "toImageButtonOptions": {"format": "svg", "filename": "attention"},
        "displaylogo": False,
    }
    png = export_config("cross_l2_h3.png", "png")
    assert png["toImageButtonOptions"]["format"] == "png"
    assert png["toImageButtonOptions"]["filename"] == "cross_l2_h3"  # plotly adds the extension
    assert png["displaylogo"] is False
    with pytest.raises(ValueError, match="png"):
        export_config("x", "jpeg")


def test_figures_stay_small():
    n = 512
    fig = attention_heatmap(
        random_maps(n, n, seed=5), ["▁a"] * n, ["▁b"] * n, "decoder", mask=np.tril(np.ones((n, n), bool))
    )
    assert len(fig.to_json()) < 5_000_000
    grid = head_grid(random_maps(6, 8, 100, 100, seed=6), ["▁a"] * 100, ["▁b"] * 100, "encoder")
    assert len(grid.to_json()) < 1_500_000


# ---------------------------------------------------------------------------------------------
# The head atlas's map


def test_head_map_places_and_colours_every_head():
    from attnviz.figures.atlas import STATISTIC_LABELS, head_map

    layers, heads = [1, 1, 2, 2], [1, 2, 1, 2]
    x, y, values = [0.1, -0.2, 0.3, 0.0], [0.0, 0.5, -0.5, 0.2], [1.5, float("nan"), 0.25, 2.0]
    fig = head_map(layers, heads, x, y, values, "entropy", "encoder", selected=(2, 1), positional=[0, 0, 1, 0])
    grey, coloured, ring = fig.data
    assert list(grey.x) == [-0.2] and list(grey.customdata[0]) == [1, 2], "a NaN value is drawn grey, not as 0"
    np.testing.assert_array_equal(coloured.x, [0.1, 0.3, 0.0])
    np.testing.assert_array_equal(coloured.marker.color, [1.5, 0.25, 2.0])
    assert list(coloured.text) == ["L1H1", "L2H1", "L2H2"]
    assert list(coloured.marker.symbol) == ["circle", "diamond", "circle"], "positional heads are diamonds"
    assert coloured.marker.colorbar.title.text == STATISTIC_LABELS["entropy"] == "entropy (nats)"
    assert (list(ring.x), list(ring.y)) == ([0.3], [-0.5]) and ring.marker.line.color == HIGHLIGHT
    assert "Encoder self-attention" in fig.layout.title.text


def test_head_map_refuses_what_it_cannot_draw():
    from attnviz.figures.atlas import head_map

    with pytest.raises(ValueError, match="one entry per head"):
        head_map([1], [1, 2], [0], [0], [0], "entropy", "cross")
    with pytest.raises(ValueError, match="statistic must be one of"):
        head_map([1], [1], [0], [0], [0], "positional", "cross")
    with pytest.raises(ValueError, match="kind must be one of"):
        head_map([1], [1], [0], [0], [0], "entropy", "self")


def test_every_atlas_statistic_has_a_label_with_its_unit():
    from attnviz.atlas import STATISTICS
    from attnviz.figures.atlas import STATISTIC_LABELS

    assert list(STATISTIC_LABELS) == list(STATISTICS)


def test_a_long_first_token_gets_room_under_the_title():
    """The top margin grows with the longest key label; the title sits at the top of the figure."""
    from attnviz.figures.common import above_top_labels

    short = attention_heatmap(np.full((2, 2), 0.5), ["a", "b"], ["c", "d"], "encoder", title="t")
    long = attention_heatmap(np.full((2, 2), 0.5), ["a", "b"], ["▁Thursday" * 3, "d"], "encoder", title="t")
    assert long.layout.margin.t > short.layout.margin.t + 100
    assert (long.layout.title.text, long.layout.title.yref, long.layout.title.y) == ("t", "container", 1.0)
    assert above_top_labels("t", ["&lt;s&gt;"])["margin"]["t"] == above_top_labels("t", ["<s>"])["margin"]["t"]
