"""Figures of the methods: contribution maps, relevance bars and the clickable importance grid."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.figures.contributions import contribution_heatmap, importance_grid, relevance_bars
from attnviz.kinds import causal_mask


def test_contribution_heatmap_has_its_own_scale_name_and_grey_masks():
    values = np.array([[2.0, 0.0, 0.0], [1.0, 5.0, 0.0], [0.5, 0.5, 3.0]], dtype=np.float32)
    fig = contribution_heatmap(values, ["a", "b", "c"], ["a", "b", "c"], "decoder", "norm", mask=causal_mask(3))
    data = fig.data[0]
    assert data.name == "norm" and data.colorbar.title.text == "norm" and "norm" in data.hovertemplate
    assert (data.zmin, data.zmax) == (0.0, 5.0), "norms have no upper bound: the scale ends at the largest"
    assert np.isnan(np.asarray(data.z, dtype=float)[0, 1]), "a masked cell is no value"
    assert fig.data[1].name == "masked"
    shares = contribution_heatmap(values / 10, ["a", "b", "c"], ["x", "y", "z"], "cross", "share", zmax=1.0)
    assert shares.data[0].zmax == 1.0
    assert contribution_heatmap(np.zeros((2, 2)), ["a", "b"], ["x", "y"], "cross", "share").data[0].zmax == 1.0


def test_a_contribution_colour_bar_is_ticked_along_its_own_scale():
    """The weights' ticks (0, 0.25, ..., 1) piled up at the bottom of a norm's 0..5 bar: plotly's own ticks."""
    values = np.array([[2.0, 5.0], [1.0, 4.0]], dtype=np.float32)
    bar = contribution_heatmap(values, ["a", "b"], ["x", "y"], "cross", "norm").data[0].colorbar
    assert bar.tickvals is None and bar.ticktext is None


def test_importance_grid_is_symmetric_and_every_cell_can_be_clicked():
    scores = np.array([[0.2, -0.05, 0.0], [0.01, 0.0, -0.3]])
    fig = importance_grid(scores, "cross", selected=(2, 3))
    heat, cells = fig.data
    assert heat.zmin == -heat.zmax == pytest.approx(-0.3), "0 sits in the middle of the colour scale"
    assert list(heat.x) == ["1", "2", "3"] and list(heat.y) == ["1", "2"]
    cells_at = [tuple(c) for c in np.asarray(cells.customdata).tolist()]
    assert cells_at == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)], "(layer, head) from 1, row by row"
    assert [(y, x) for x, y in zip(cells.x, cells.y, strict=True)] == [(str(a), str(b)) for a, b in cells_at]
    assert cells.marker.opacity == 0.0 and fig.layout.hoverdistance == -1 and "select" in fig.layout.clickmode
    (outline,) = fig.layout.shapes
    assert (outline.x0, outline.x1, outline.y0, outline.y1) == (1.5, 2.5, 0.5, 1.5), "layer 2, head 3"
    with pytest.raises(ValueError, match="selected"):
        importance_grid(scores, "cross", selected=(3, 1))


def test_relevance_bars_label_both_sides():
    fig = relevance_bars(["a", "</s>"], np.array([0.1, 0.2]), ["<s>", "x", "y"], np.array([0.0, 1.0, 0.5]), "'y'")
    source, target = fig.data
    assert list(source.y) == ["0 a", "1 &lt;/s&gt;"] and list(target.x) == [0.0, 1.0, 0.5]
    assert "Relevance for 'y'" in fig.layout.title.text
    with pytest.raises(ValueError, match="source"):
        relevance_bars(["a"], np.array([0.1, 0.2]), ["x"], np.array([1.0]), "x")


def test_relevance_bars_of_a_language_model_have_one_side():
    (tokens,) = relevance_bars(None, None, ["<s>", "x", "y"], np.array([0.0, 1.0, 0.5]), "'y'").data
    assert list(tokens.y) == ["0 &lt;s&gt;", "1 x", "2 y"] and list(tokens.x) == [0.0, 1.0, 0.5]
    with pytest.raises(ValueError, match="together"):
        relevance_bars(None, np.array([0.1]), ["x"], np.array([1.0]), "x")
