"""The image renderer: decoded images equal the maps, contrast modes, the peak-keeping grid, differences.

Images are decoded from the figure's PNG data URI and compared, cell by cell, with the contrast
written out here from its definition, so a wrong colour level, a transposed axis or a dropped mask
shows as a failure.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from plotly.colors import get_colorscale, hex_to_rgb, sample_colorscale
from test_plots import drawn_lines

from attnviz.analysis import downsample
from attnviz.figures.attention import attention_heatmap, lines_view
from attnviz.figures.common import HIGHLIGHT, MASKED_GREY
from attnviz.figures.compare import difference_image
from attnviz.figures.images import (
    LEVELS,
    MASKED_INDEX,
    attention_image,
    colour_bar,
    contrast_values,
    decode_png,
    grid_layout,
    head_grid,
    palette,
    scores_image,
)
from attnviz.kinds import causal_mask

STEP = 1 / (LEVELS - 1)  # one colour level, in 0..1


def random_maps(*shape: int, seed: int = 0, sharpness: float = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    maps = rng.random(shape) ** sharpness
    return (maps / maps.sum(-1, keepdims=True)).astype(np.float32)


def by_definition(weights: np.ndarray, contrast: str) -> np.ndarray:
    """The contrast modes written out, one cell at a time."""
    out = np.zeros(weights.shape)
    for q in range(weights.shape[0]):
        row_max = max(float(w) for w in weights[q])
        for k in range(weights.shape[1]):
            w = float(weights[q, k])
            if contrast == "linear":
                out[q, k] = w
            elif contrast == "log":
                out[q, k] = (math.log10(max(w, 1e-5)) + 5) / 5
            else:
                out[q, k] = w / row_max if row_max > 0 else 0.0
    return out


def image_of(fig) -> tuple[np.ndarray, np.ndarray]:
    (image,) = [t for t in fig.data if t.type == "image"]
    return decode_png(image.source)


def test_contrast_values_checked_by_hand():
    w = np.array([[1.0, 0.1, 1e-3, 1e-7], [0.2, 0.4, 0.0, 0.0]])
    np.testing.assert_allclose(contrast_values(w, "log")[0], [1.0, 0.8, 0.4, 0.0])
    np.testing.assert_allclose(contrast_values(w, "row")[1], [0.5, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(contrast_values(w, "linear"), w)
    np.testing.assert_allclose(contrast_values(w[:, :2], "row", row_max=np.array([2.0, 0.8]))[1], [0.25, 0.5])
    np.testing.assert_array_equal(contrast_values(np.zeros((1, 3)), "row"), 0.0)
    with pytest.raises(ValueError, match="contrast must be one of"):
        contrast_values(w, "loud")


def test_the_palette_is_the_weight_scale_then_the_masked_grey():
    colours = palette("Blues")
    assert colours.shape == (LEVELS + 2, 3)
    expected = sample_colorscale(get_colorscale("Blues"), [0.0, 0.5, 1.0])
    for index, colour in zip([0, (LEVELS - 1) // 2, LEVELS - 1], expected, strict=True):
        rgb = [float(c) for c in colour[colour.index("(") + 1 : -1].split(",")]
        np.testing.assert_allclose(colours[index], rgb, atol=1.5)
    assert tuple(colours[MASKED_INDEX]) == hex_to_rgb(MASKED_GREY)


@pytest.mark.parametrize("contrast", ["linear", "log", "row"])
def test_the_one_head_image_equals_the_map(contrast):
    Q, K = 37, 53
    weights = random_maps(Q, K, seed=1, sharpness=8)
    fig = attention_image(weights, [f"q{i}" for i in range(Q)], [f"k{i}" for i in range(K)], "cross", contrast)
    indices, colours = image_of(fig)
    assert indices.shape == (Q, K), "one pixel per weight, rows are queries"
    np.testing.assert_array_equal(colours[: LEVELS + 1], palette("Blues")[: LEVELS + 1])
    np.testing.assert_allclose(indices * STEP, by_definition(weights, contrast), atol=STEP / 2 + 1e-9)
    assert fig.layout.yaxis.title.text.startswith("query") and fig.layout.xaxis.title.text.startswith("key")
    assert "query %{y}" in fig.data[0].hovertemplate and "key %{x}" in fig.data[0].hovertemplate
    assert fig.data[1].marker.colorbar.title.text == colour_bar(contrast)["title"]["text"]
    assert {"linear": "weight", "log": "weight (log scale)", "row": "weight ÷ its row's max"}[contrast] == (
        fig.data[1].marker.colorbar.title.text
    )


def test_masked_cells_are_grey_and_never_a_weight():
    n = 20
    weights = np.tril(random_maps(n, n, seed=2))
    weights /= weights.sum(-1, keepdims=True)
    fig = attention_image(weights, ["t"] * n, ["t"] * n, "decoder", "log", mask=causal_mask(n))
    indices, _ = image_of(fig)
    assert (indices[~causal_mask(n)] == MASKED_INDEX).all()
    assert (indices[causal_mask(n)] < LEVELS).all()
    assert "grey: masked" in fig.layout.title.subtitle.text


def test_a_1024_token_map_is_sent_small():
    n = 1024
    weights = random_maps(n, n, seed=3, sharpness=20)
    fig = attention_image(weights, ["▁a"] * n, ["▁b"] * n, "encoder", "log")
    assert len(fig.to_json()) < 1_500_000  # the target of issue 14, with a noisy worst case
    indices, _ = image_of(fig)
    assert indices.shape == (n, n)
    assert len(fig.layout.xaxis.tickvals) <= 40 and fig.layout.xaxis.ticktext[1] == f"{fig.layout.xaxis.tickvals[1]} ▁b"


def max_pooled_by_definition(values: np.ndarray, size: int) -> np.ndarray:
    """Max over near-equal contiguous blocks, written with np.array_split."""
    rows = np.array_split(np.arange(values.shape[0]), min(size, values.shape[0]))
    cols = np.array_split(np.arange(values.shape[1]), min(size, values.shape[1]))
    return np.array([[values[np.ix_(r, c)].max() for c in cols] for r in rows])


def test_downsample_max_keeps_every_peak():
    values = np.random.default_rng(4).random((23, 17))
    np.testing.assert_array_equal(downsample(values, 5, how="max")[0], max_pooled_by_definition(values, 5))
    eye = np.eye(512)
    assert (np.diag(downsample(eye, 96, how="max")[0]) == 1).all(), "a diagonal of 1s stays 1s"
    assert np.diag(downsample(eye, 96)[0]).max() < 0.25, "where averaging fades it"
    with pytest.raises(ValueError, match="how"):
        downsample(values, 5, how="median")


@pytest.mark.parametrize("contrast", ["linear", "row"])
def test_the_grid_holds_every_head_max_pooled(contrast):
    L, H, Q, K, thumb = 2, 3, 40, 30, 16
    maps = random_maps(L, H, Q, K, seed=5, sharpness=10)
    fig = head_grid(maps, ["q"] * Q, ["k"] * K, "cross", contrast, selected=(2, 3), thumbnail=thumb)
    indices, _ = image_of(fig)
    width, height, xs, ys = grid_layout(L, H, thumb, thumb)
    assert indices.shape == (height, width)
    for layer in range(L):
        for head in range(H):
            tile = indices[ys[layer] : ys[layer] + thumb, xs[head] : xs[head] + thumb]
            expected = max_pooled_by_definition(by_definition(maps[layer, head], contrast), thumb)
            np.testing.assert_allclose(tile * STEP, expected, atol=STEP / 2 + 1e-6)
    assert "max-pooled" in fig.layout.title.text and "up to 3x2 weights" in fig.layout.title.text
    points = [t for t in fig.data if t.type == "scatter" and t.customdata is not None][0]
    assert [tuple(c) for c in points.customdata] == [(lay, h) for lay in (1, 2) for h in (1, 2, 3)]
    assert [s.line.color for s in fig.layout.shapes].count(HIGHLIGHT) == 1
    assert list(fig.layout.xaxis.ticktext) == ["head 1", "head 2", "head 3"]


def test_a_sharp_head_stays_sharp_in_a_long_grid():
    n = 512
    previous = np.zeros((1, 1, n, n), dtype=np.float32)
    previous[0, 0, np.arange(1, n), np.arange(n - 1)] = 1.0
    previous[0, 0, 0, 0] = 1.0
    indices, _ = image_of(head_grid(previous, ["t"] * n, ["t"] * n, "encoder"))
    assert indices.shape == (96, 96)
    assert (indices[np.arange(96), np.arange(96)] == LEVELS - 1).all(), "the line is at full strength"


def test_grid_masked_blocks_are_grey():
    n = 8
    maps = np.tril(random_maps(1, 2, n, n, seed=6))
    indices, _ = image_of(head_grid(maps, ["t"] * n, ["t"] * n, "decoder", mask=causal_mask(n)))
    assert (indices[:n, :n][~causal_mask(n)] == MASKED_INDEX).all()
    with pytest.raises(ValueError, match="one flag per cell"):
        head_grid(maps, ["t"] * n, ["t"] * n, "decoder", mask=causal_mask(n - 1))


def test_the_difference_image_is_centred_at_zero():
    a, b = random_maps(12, 9, seed=7), random_maps(12, 9, seed=8)
    fig = difference_image(a - b, [f"q{i}" for i in range(12)], [f"k{i}" for i in range(9)], "encoder", "A - B")
    indices, colours = image_of(fig)
    limit = np.abs(a - b).max()
    np.testing.assert_allclose(indices * STEP, ((a - b) / limit + 1) / 2, atol=STEP / 2 + 1e-6)
    np.testing.assert_array_equal(colours[: LEVELS + 1], palette("RdBu_r")[: LEVELS + 1])
    assert fig.data[1].marker.colorbar.ticktext[1] == "0"


def test_the_exact_heatmap_takes_a_contrast_and_keeps_the_weights_for_hover():
    weights = random_maps(6, 8, seed=9, sharpness=6)
    fig = attention_heatmap(
        weights[2:5, 3:7],
        ["q"] * 3,
        ["k"] * 4,
        "encoder",
        query_start=2,
        key_start=3,
        contrast="row",
        row_max=weights[2:5].max(-1),
    )
    np.testing.assert_allclose(fig.data[0].z, weights[2:5, 3:7] / weights[2:5].max(-1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(fig.data[0].customdata, weights[2:5, 3:7])
    assert "customdata" in fig.data[0].hovertemplate
    assert list(fig.data[0].y)[0] == "2 q" and list(fig.data[0].x)[0] == "3 k"
    assert fig.data[0].colorbar.title.text == "weight ÷ its row's max"
    with pytest.raises(ValueError, match="contrast applies to weights"):
        attention_heatmap(weights, ["q"] * 6, ["k"] * 8, "encoder", scores=True, contrast="log")


def test_lines_take_their_opacity_from_the_contrast():
    maps = random_maps(1, 4, 5, seed=10)
    fig = lines_view(maps, ["q"] * 4, ["k"] * 5, [1], "encoder", threshold=0.0, contrast="log")
    lines = drawn_lines(fig)
    assert len(lines) == maps[0].size
    for (_, q, k), (opacity, _) in lines.items():
        assert opacity == pytest.approx(max(1, round(by_definition(maps[0], "log")[q, k] * 64)) / 64)
    assert "logarithmic" in fig.layout.title.subtitle.text


def test_the_scores_image_is_centred_at_zero_and_greys_the_masked():
    rng = np.random.default_rng(11)
    scores = rng.normal(size=(10, 10)) * 3
    scores[~causal_mask(10)] = -np.inf
    indices, colours = image_of(scores_image(scores, ["t"] * 10, ["t"] * 10, "decoder"))
    finite = causal_mask(10)
    limit = np.abs(scores[finite]).max()
    np.testing.assert_allclose(indices[finite] * STEP, (scores[finite] / limit + 1) / 2, atol=STEP / 2 + 1e-6)
    assert (indices[~finite] == MASKED_INDEX).all()
    np.testing.assert_array_equal(colours[: LEVELS + 1], palette("RdBu_r")[: LEVELS + 1])
