"""Maps tile by tile from queries and keys (attnviz.tiles) against the maps the model itself returns.

The reference is [`attnviz.attention`][attnviz.api.attention]: the model's explicit softmax path, every map at once.
The tiled path never sees those maps: it records the queries and keys (fused kernel, no map) and
recomputes weights from them block by block. Shapes are chosen so that blocks are partial (rows and
columns not multiples of any block) and several blocks of rows are needed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnviz
from attnviz import analysis, tiles
from attnviz.tiles import HeadQK

ATOL = 2e-6  # float32 weights from two orders of summation


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _numpy_map(head: HeadQK) -> np.ndarray:
    """The map by equation 1 in float64 numpy, causal mask applied: an independent reference."""
    scores = head.queries.astype(np.float64) @ head.keys.astype(np.float64).T / math.sqrt(head.queries.shape[1])
    if head.causal:
        scores = np.where(np.tril(np.ones(scores.shape, dtype=bool)), scores, -np.inf)
    return _softmax_rows(scores)


def _max_pool(values: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """Blocks of fr x fc from the top left (the last ones short), each its largest value: plain loops."""
    h, w = math.ceil(values.shape[0] / fr), math.ceil(values.shape[1] / fc)
    out = np.empty((h, w))
    for i in range(h):
        for j in range(w):
            out[i, j] = values[i * fr : (i + 1) * fr, j * fc : (j + 1) * fc].max()
    return out


def _random_head(Q: int, K: int, causal: bool, seed: int = 0, d: int = 16, sharp: float = 3.0) -> HeadQK:
    rng = np.random.default_rng(seed)
    q = (rng.normal(size=(Q, d)) * sharp).astype(np.float32)
    k = rng.normal(size=(K, d)).astype(np.float32)
    return HeadQK(q, k, causal)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of a few hundred scores, so that short maps still take many partial blocks."""
    monkeypatch.setattr(tiles, "BLOCK_ELEMENTS", 700)


# ---------------------------------------------------------------------------------------------
# One head, against numpy


@pytest.mark.parametrize(("Q", "K", "causal"), [(97, 97, True), (61, 83, False), (83, 61, False)])
def test_a_whole_map_and_any_tile_equal_equation_1(Q, K, causal):
    head = _random_head(Q, K, causal)
    reference = _numpy_map(head)
    kind = "decoder" if causal else "cross"
    scanned = tiles.scan(head, kind)
    np.testing.assert_allclose(tiles.tile(head, scanned, (0, Q), (0, K)), reference, atol=ATOL, rtol=1e-5)
    for rows, cols in [((5, 40), (3, 29)), ((Q - 7, Q), (0, K)), ((0, 1), (K - 1, K))]:
        np.testing.assert_allclose(
            tiles.tile(head, scanned, rows, cols), reference[slice(*rows), slice(*cols)], atol=ATOL, rtol=1e-5
        )
    np.testing.assert_allclose(scanned.row_max, reference.max(-1), rtol=1e-5)


@pytest.mark.parametrize("per_row_max", [False, True])
@pytest.mark.parametrize(("Q", "K", "causal"), [(97, 97, True), (61, 83, False)])
def test_a_pooled_region_is_the_maximum_of_each_block(Q, K, causal, per_row_max):
    head = _random_head(Q, K, causal, seed=1)
    reference = _numpy_map(head)
    if per_row_max:
        reference = reference / reference.max(-1, keepdims=True)
    scanned = tiles.scan(head, "decoder" if causal else "cross")
    for rows, cols, pixels in [((0, Q), (0, K), 10), ((9, 58), (4, 55), 7), ((20, 41), (0, 21), 64)]:
        values, allowed, (fr, fc) = tiles.region(head, scanned, rows, cols, pixels, per_row_max)
        part = reference[slice(*rows), slice(*cols)]
        assert (fr, fc) == (math.ceil(part.shape[0] / pixels), math.ceil(part.shape[1] / pixels))
        assert values.shape == allowed.shape and max(values.shape) <= pixels
        np.testing.assert_allclose(values, _max_pool(part, fr, fc), atol=ATOL, rtol=1e-5)
        if causal:
            mask = np.tril(np.ones((Q, K), dtype=bool))[slice(*rows), slice(*cols)]
            np.testing.assert_array_equal(allowed, _max_pool(mask, fr, fc) > 0)
            assert (values[~allowed] == 0).all()
        else:
            assert allowed.all()


@pytest.mark.parametrize("per_row_max", [False, True])
def test_a_scans_column_maxima_pool_the_whole_map(per_row_max):
    head = _random_head(89, 89, True, seed=2)
    reference = _numpy_map(head)
    if per_row_max:
        reference = reference / reference.max(-1, keepdims=True)
    scanned = tiles.scan(head, "decoder", column_block=9)
    pooled = tiles.pooled_from_scan(scanned, 9, per_row_max)
    np.testing.assert_allclose(pooled, _max_pool(reference, 9, 9), atol=ATOL, rtol=1e-5)
    region, _, blocks = tiles.region(head, scanned, (0, 89), (0, 89), 10, per_row_max)
    assert blocks == (9, 9)
    np.testing.assert_allclose(pooled, region, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("causal, column_block", [(True, 7), (False, 10), (True, 1)])
def test_a_scan_without_statistics_keeps_the_same_normalisers_and_maxima(causal, column_block):
    head = _random_head(53, 53 if causal else 61, causal, seed=4)
    kind = "decoder" if causal else "cross"
    full = tiles.scan(head, kind, column_block=column_block)
    lean = tiles.scan(head, kind, column_block=column_block, statistics=False)
    assert lean.rows == {} and full.rows
    for name in ("lse", "row_max", "column_maxima"):
        np.testing.assert_array_equal(getattr(lean, name), getattr(full, name))
    reference = _numpy_map(head)
    np.testing.assert_allclose(lean.row_max, reference.max(-1), atol=ATOL, rtol=1e-5)
    np.testing.assert_allclose(
        tiles.pooled_from_scan(lean, 1), _max_pool(reference, 1, column_block), atol=ATOL, rtol=1e-5
    )


@pytest.mark.parametrize(("kind", "Q", "K"), [("decoder", 97, 97), ("encoder", 64, 64), ("cross", 37, 90)])
def test_statistics_from_a_scan_equal_the_dense_ones(kind, Q, K):
    head = _random_head(Q, K, kind == "decoder", seed=3, sharp=2.0)
    tokens = [f"t{i % 13}" for i in range(max(Q, K))]  # repeats, for the induction score
    dense = analysis.head_statistics(_numpy_map(head)[None, None], tokens[:Q], tokens[:K], kind)
    row = tiles.statistics_row(tiles.scan(head, kind, tokens=tokens[:Q]))
    assert math.isnan(row["induction"]) != (kind == "decoder")
    for name in tiles.STATISTICS:
        want = float(dense[name].iloc[0])
        if math.isnan(want):
            assert math.isnan(row[name]), name
        else:
            assert row[name] == pytest.approx(want, rel=1e-5, abs=1e-6), name


def test_a_tile_outside_the_map_or_a_mask_that_does_not_fit_is_refused():
    head = _random_head(10, 10, True)
    scanned = tiles.scan(head, "decoder")
    with pytest.raises(ValueError, match="0 <= start < stop"):
        tiles.tile(head, scanned, (5, 11), (0, 3))
    with pytest.raises(ValueError, match="causal"):
        tiles.scan(head, "encoder")
    with pytest.raises(ValueError, match="square"):
        HeadQK(head.queries, head.keys[:5], causal=True)


def test_scores_that_overflow_float32_are_refused_and_large_finite_ones_drawn():
    """Finite queries and keys whose products overflow float32 had given NaN normalisers: every weight NaN, drawn
    as an empty map with no word. Products just under the limit are drawn, and equal float64's softmax."""
    from attnviz.errors import NonFiniteError

    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(2, 1, 50, 8)).astype(np.float32), rng.normal(size=(2, 1, 60, 8)).astype(np.float32)
    q[1, 0, 37] *= 1e19  # layer 2's row 37: scores of about 1e39 / sqrt(8), over float32's 3.4e38
    k[1] *= 1e20
    tiled = tiles.TiledAttention({"cross": q}, {"cross": k}, tuple("s" * 60), tuple("t" * 50), {})
    assert np.isfinite(q).all() and np.isfinite(k).all()
    row = r"the cross scores of query row 37 \(from 0\) are not finite numbers"
    for call in (
        lambda: tiled.map("cross", 2, 1),
        lambda: tiled.layer_tiles("cross", 2),
        lambda: tiled.statistics("cross"),
    ):
        with pytest.raises(NonFiniteError, match="^layer 2, head 1: " + row):
            call()
    with pytest.raises(NonFiniteError, match="^" + row):
        tiles.scan(tiled.head("cross", 2, 1), "cross")
    nan = q.copy()
    nan[0, 0, 4, 2] = np.nan
    with pytest.raises(NonFiniteError, match=r"row 4 \(from 0\)"):
        tiles.scan(HeadQK(nan[0, 0], k[0, 0], causal=False), "cross")
    # layer 1 is untouched; scores near 1e37 (under the limit, far over exp's) are drawn exactly as float64 does
    np.testing.assert_allclose(tiled.map("cross", 1, 1), _numpy_map(tiled.head("cross", 1, 1)), atol=ATOL, rtol=1e-5)
    large = HeadQK(q[0, 0] * 1e18, k[0, 0] * 1e18, causal=False)
    assert 1e36 < np.abs(large.queries.astype(np.float64) @ large.keys.T.astype(np.float64)).max() < 1e38
    np.testing.assert_allclose(tiles.tile(large, tiles.scan(large, "cross"), (0, 50), (0, 60)), _numpy_map(large))


# ---------------------------------------------------------------------------------------------
# Every head of a real model: tiled_attention against attnviz.attention


def _check_against_export(bundle, src, tgt=None):
    tiled = attnviz.tiled_attention(bundle, src, tgt)
    export = attnviz.attention(bundle, src, tgt)
    for kind in tiled.kinds:
        maps = getattr(export, kind)
        L, H, Q, K = maps.shape
        assert tiled.shape(kind) == (L, H, Q, K)
        assert tiled.tokens(kind) == export.tokens(kind)
        for layer in range(1, L + 1):
            for head in range(1, H + 1):
                np.testing.assert_allclose(
                    tiled.map(kind, layer, head), maps[layer - 1, head - 1], atol=ATOL, rtol=1e-4, err_msg=kind
                )
        dense = analysis.head_statistics(maps, *export.tokens(kind), kind)
        got = tiled.statistics(kind)
        assert list(got.columns) == list(dense.columns)
        numbers = [c for c in dense.columns if c not in ("layer", "head")]
        np.testing.assert_allclose(got[numbers], dense[numbers], atol=2e-5, err_msg=kind)
        assert got.attrs == dense.attrs
    assert tiled.writes() == export.writes()
    kind = tiled.kinds[-1]
    layer = tiled.layer_tiles(kind, 1, thumbnail=5)
    maps = getattr(export, kind)[0]
    fr, fc = layer.blocks
    assert layer.thumbnails.shape[:2] == (maps.shape[0], 2) and max(layer.thumbnails.shape[2:]) <= 5
    for h, thumbnails in enumerate(layer.thumbnails):
        np.testing.assert_allclose(thumbnails[0], _max_pool(maps[h], fr, fc), atol=ATOL)
        np.testing.assert_allclose(
            thumbnails[1], _max_pool(maps[h] / maps[h].max(-1, keepdims=True), fr, fc), atol=1e-5
        )
    assert tiles.statistics_frame(layer.statistics(), kind).equals(tiled.statistics(kind).iloc[: maps.shape[0]])


def test_an_encoder_decoders_three_kinds_equal_its_maps():
    _check_against_export(attnviz.load("en-de", device="cpu"), "Thursday, July 2, 1998")


def test_a_language_models_causal_maps_equal_its_maps():
    _check_against_export(attnviz.load("induction", device="cpu"), "q w e r t y u i o p a s d " * 4)


def test_grouped_query_heads_read_their_groups_keys(tmp_path):
    pytest.importorskip("transformers")
    from lm_models import build

    build("llama", tmp_path / "llama")  # 4 query heads over 2 key/value heads, rotary positions
    bundle = attnviz.load(str(tmp_path / "llama"), device="cpu")
    assert bundle.config.kv_heads < bundle.config.n_heads
    tiled = attnviz.tiled_attention(bundle, "When Mary and John went to the store, John gave a drink to")
    assert tiled.keys["decoder"].shape[1] == bundle.config.kv_heads
    _check_against_export(bundle, "When Mary and John went to the store, John gave a drink to")
