"""Head averages, rollout, per-head statistics, long-form export and thumbnails, on hand-computed maps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.analysis import (
    DISTANCE_NOTES,
    attention_rollout,
    downsample,
    head_max,
    head_mean,
    head_statistics,
    induction_targets,
    long_form,
)

SRC = ("a", "b", "</s>")
TGT = ("<s>", "x", "y")


def _softmax_maps(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    scores = np.random.default_rng(seed).normal(size=shape)
    weights = np.exp(scores)
    return (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


def _one_layer(*heads: np.ndarray) -> np.ndarray:
    """(1, H, Q, K) maps from (Q, K) heads, float32 like an export."""
    return np.stack(heads)[None].astype(np.float32)


def _stats(maps: np.ndarray, query_tokens=SRC, key_tokens=SRC, kind: str = "encoder") -> dict:
    """The statistics of a single (layer, head) as a dict."""
    frame = head_statistics(maps, query_tokens, key_tokens, kind)
    assert len(frame) == 1
    return frame.iloc[0].to_dict()


UNIFORM = np.full((3, 3), 1 / 3)
DIAGONAL = np.eye(3)
PREVIOUS = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=float)  # query 0 has no previous token
CAUSAL_UNIFORM = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]


# ---------------------------------------------------------------------------------------------
# head_mean, head_max


def test_head_mean_and_max_of_disagreeing_heads():
    left, right = np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 1.0], [0.0, 1.0]])
    maps = np.stack([left, right])  # (H=2, Q, K)
    np.testing.assert_allclose(head_mean(maps), np.full((2, 2), 0.5))  # the blur that no head shows
    np.testing.assert_allclose(head_max(maps), np.ones((2, 2)))
    np.testing.assert_allclose(head_max(maps).sum(axis=-1), [2.0, 2.0])  # not a distribution


def test_head_mean_and_max_reduce_the_head_axis_of_4d_and_3d_maps():
    maps = _softmax_maps((2, 3, 4, 5))
    assert head_mean(maps).shape == (2, 4, 5)
    assert head_max(maps).shape == (2, 4, 5)
    assert head_mean(maps[0]).shape == (4, 5)
    np.testing.assert_allclose(head_mean(maps)[1, 2, 3], maps[1, :, 2, 3].mean(), rtol=1e-6)
    np.testing.assert_allclose(head_max(maps)[1, 2, 3], maps[1, :, 2, 3].max())


def test_head_mean_rejects_a_single_matrix():
    with pytest.raises(ValueError, match="heads"):
        head_mean(np.eye(3))


# ---------------------------------------------------------------------------------------------
# attention_rollout


def test_rollout_of_identity_attention_is_identity():
    maps = np.broadcast_to(np.eye(4), (3, 2, 4, 4))
    rollout = attention_rollout(maps)
    assert rollout.shape == (3, 4, 4)
    np.testing.assert_allclose(rollout, np.broadcast_to(np.eye(4), (3, 4, 4)))


def test_rollout_rows_sum_to_one():
    rollout = attention_rollout(_softmax_maps((4, 3, 5, 5)))
    np.testing.assert_allclose(rollout.sum(axis=-1), np.ones((4, 5)), atol=1e-6)


def test_rollout_matches_a_hand_computation_for_two_layers():
    # Layer 1: head mean [[1, 0], [.5, .5]] -> A1 = .5 W + .5 I = [[1, 0], [.25, .75]].
    # Layer 2: head mean [[0, 1], [0, 1]]   -> A2 = [[.5, .5], [0, 1]].
    # A2 @ A1 = [[.625, .375], [.25, .75]]; the other order, A1 @ A2, would give [[.5, .5], [.125, .875]].
    layer1 = np.stack([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])
    layer2 = np.stack([[[0.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])
    rollout = attention_rollout(np.stack([layer1, layer2]).astype(np.float32))
    np.testing.assert_allclose(rollout[0], [[1.0, 0.0], [0.25, 0.75]])
    np.testing.assert_allclose(rollout[1], [[0.625, 0.375], [0.25, 0.75]])
    # Without the residual it is the plain product of head means: W2 @ W1.
    plain = attention_rollout(np.stack([layer1, layer2]), add_residual=False)
    np.testing.assert_allclose(plain[1], [[0.5, 0.5], [0.5, 0.5]])


def test_rollout_rejects_cross_attention_shapes():
    with pytest.raises(ValueError, match=r"\(layers, heads, S, S\)"):
        attention_rollout(np.ones((2, 2, 3, 4)) / 4)


# ---------------------------------------------------------------------------------------------
# head_statistics


def test_statistics_of_a_uniform_map():
    s = _stats(_one_layer(UNIFORM))
    assert s["entropy"] == pytest.approx(math.log(3))
    assert s["entropy_norm"] == pytest.approx(1.0)
    # Distances: query 0 -> (0+1+2)/3, query 1 -> (1+0+1)/3, query 2 -> (2+1+0)/3; mean 8/9.
    assert s["mean_distance"] == pytest.approx(8 / 9)
    for column in ("diagonal", "previous", "first", "end"):
        assert s[column] == pytest.approx(1 / 3), column


def test_statistics_of_a_diagonal_map():
    s = _stats(_one_layer(DIAGONAL))
    assert s["entropy"] == pytest.approx(0.0)
    assert s["diagonal"] == pytest.approx(1.0)
    assert s["mean_distance"] == pytest.approx(0.0)
    assert s["previous"] == pytest.approx(0.0)
    assert s["first"] == pytest.approx(1 / 3)  # only query 0 looks at key 0
    assert s["end"] == pytest.approx(1 / 3)


def test_statistics_of_a_previous_token_map():
    s = _stats(_one_layer(PREVIOUS))
    assert s["previous"] == pytest.approx(1.0)  # over queries 1 and 2, the ones with a previous token
    assert s["diagonal"] == pytest.approx(1 / 3)  # query 0 can only look at itself
    assert s["mean_distance"] == pytest.approx(2 / 3)
    assert s["end"] == pytest.approx(0.0)


def test_statistics_rows_are_layer_and_head_from_one():
    maps = np.broadcast_to(UNIFORM, (2, 3, 3, 3)).copy()
    maps[1, 2] = DIAGONAL  # layer 2, head 3
    frame = head_statistics(maps, SRC, SRC, "encoder")
    assert list(frame.columns) == [
        "layer",
        "head",
        "entropy",
        "entropy_norm",
        "mean_distance",
        "diagonal",
        "previous",
        "first",
        "end",
        "bos",
        "induction",
    ]
    assert frame["bos"].isna().all() and frame["induction"].isna().all()  # decoder self-attention only
    assert list(zip(frame["layer"], frame["head"], strict=True)) == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    sharp = frame[frame["diagonal"] > 0.99]
    assert list(zip(sharp["layer"], sharp["head"], strict=True)) == [(2, 3)]
    assert frame["entropy"].iloc[-1] == pytest.approx(0.0)
    assert frame["entropy"].iloc[:-1].tolist() == pytest.approx([math.log(3)] * 5)


def test_decoder_entropy_norm_counts_only_the_keys_a_query_may_see():
    # Query t is uniform over its t + 1 allowed keys: entropies 0, log 2, log 3, each the maximum.
    s = _stats(_one_layer(CAUSAL_UNIFORM), TGT, TGT, "decoder")
    assert s["entropy"] == pytest.approx((math.log(2) + math.log(3)) / 3)
    assert s["entropy_norm"] == pytest.approx(2 / 3)  # query 0 has one allowed key and contributes 0
    assert math.isnan(s["end"])  # the decoder input has no end token
    assert s["first"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert s["bos"] == s["first"]  # the weight on the start token, or on a language model's first token


def test_bos_measures_an_attention_sink():
    """A head that parks three quarters of every row on position 0 and spreads the rest scores 0.75+."""
    T = 6
    sink = np.tril(np.full((T, T), 0.25))
    sink /= sink.sum(-1, keepdims=True)
    sink *= 0.25
    sink[:, 0] += 0.75
    tokens = tuple("abcdef")
    s = _stats(_one_layer(sink), tokens, tokens, "decoder")
    expected = np.mean([0.75 + 0.25 / (t + 1) for t in range(T)])
    assert s["bos"] == pytest.approx(expected)
    assert math.isnan(_stats(_one_layer(sink[:, :]), tokens, tokens, "cross")["bos"])


def test_cross_statistics_use_the_scaled_diagonal():
    # T = 3, S = 5: query positions 0, 1, 2 map onto source positions 0, 2, 4.
    tgt, src = TGT, ("a", "b", "c", "d", "</s>")
    aligned = np.zeros((3, 5))
    aligned[[0, 1, 2], [0, 2, 4]] = 1
    s = _stats(_one_layer(aligned), tgt, src, "cross")
    assert s["diagonal"] == pytest.approx(1.0)
    assert s["mean_distance"] == pytest.approx(0.0)
    assert s["end"] == pytest.approx(1 / 3)
    shifted = np.zeros((3, 5))
    shifted[[0, 1, 2], [0, 1, 3]] = 1  # one source token before the diagonal, where there is one
    assert _stats(_one_layer(shifted), tgt, src, "cross")["previous"] == pytest.approx(1.0)


def test_cross_distance_is_measured_from_the_unrounded_scaled_position():
    # T = 3, S = 4: queries map to 0, 1.5, 3; the diagonal rounds 1.5 up to key 2.
    weights = np.zeros((3, 4))
    weights[[0, 1, 2], [0, 2, 3]] = 1
    s = _stats(_one_layer(weights), TGT, ("a", "b", "c", "</s>"), "cross")
    assert s["diagonal"] == pytest.approx(1.0)
    assert s["mean_distance"] == pytest.approx(0.5 / 3)


def test_distance_note_says_how_cross_distances_are_measured():
    frame = head_statistics(_one_layer(np.full((3, 2), 0.5)), TGT, ("a", "</s>"), "cross")
    assert frame.attrs["distance_note"] == DISTANCE_NOTES["cross"]
    assert "source tokens" in DISTANCE_NOTES["cross"] and "not a distance" in DISTANCE_NOTES["cross"]


def test_statistics_leave_out_fully_masked_queries():
    weights = np.eye(3)
    weights[2] = 0  # a query whose every key was masked gets all-zero weights
    s = _stats(_one_layer(weights))
    assert s["diagonal"] == pytest.approx(1.0)  # 2/3 if the empty row were counted
    assert s["entropy"] == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("maps", "query_tokens", "key_tokens", "kind", "message"),
    [
        (_one_layer(UNIFORM), SRC[:2], SRC, "encoder", "3 query rows but 2 query tokens"),
        (_one_layer(UNIFORM), SRC, SRC + ("c",), "encoder", "3 key columns but 4 key tokens"),
        (_one_layer(UNIFORM), SRC, TGT, "encoder", "token lists differ"),
        (_one_layer(UNIFORM), SRC, SRC, "self", "kind must be one of"),
        (UNIFORM[None], SRC, SRC, "encoder", r"\(layers, heads, query, key\)"),
        (_one_layer(np.ones((3, 3))), SRC, SRC, "encoder", "sum to 1"),
        (_one_layer(UNIFORM), TGT, TGT, "decoder", "causal"),
        (_one_layer(np.full((3, 2), 0.5)), SRC, SRC[:2], "encoder", "square"),
    ],
)
def test_statistics_reject_inputs_that_do_not_fit(maps, query_tokens, key_tokens, kind, message):
    with pytest.raises(ValueError, match=message):
        head_statistics(maps, query_tokens, key_tokens, kind)


# ---------------------------------------------------------------------------------------------
# long_form


def _numbered_maps() -> np.ndarray:
    """(L=2, H=3, Q=2, K=4) maps whose every entry is its own flat index: no two cells alike."""
    return np.arange(2 * 3 * 2 * 4, dtype=np.float32).reshape(2, 3, 2, 4)


def test_long_form_has_one_row_per_weight_with_the_right_labels():
    maps = _numbered_maps()
    queries, keys = ("<s>", "x"), ("a", "b", "c", "</s>")
    frame = long_form(maps, queries, keys)
    assert list(frame.columns) == ["layer", "head", "query_index", "query_token", "key_index", "key_token", "weight"]
    assert len(frame) == 2 * 3 * 2 * 4
    row = frame[(frame["layer"] == 2) & (frame["head"] == 3) & (frame["query_index"] == 1) & (frame["key_index"] == 2)]
    assert row["weight"].tolist() == [46.0]  # ((1 * 3 + 2) * 2 + 1) * 4 + 2
    assert row[["query_token", "key_token"]].values.tolist() == [["x", "c"]]
    expected = maps[frame["layer"] - 1, frame["head"] - 1, frame["query_index"], frame["key_index"]]
    np.testing.assert_array_equal(frame["weight"].to_numpy(), expected)
    assert (frame["query_token"] == np.array(queries)[frame["query_index"]]).all()
    assert (frame["key_token"] == np.array(keys)[frame["key_index"]]).all()


def test_long_form_selects_layers_and_heads_by_their_one_based_numbers():
    maps = _numbered_maps()
    frame = long_form(maps, ("<s>", "x"), ("a", "b", "c", "</s>"), layers=[2], heads=[3, 1])
    assert len(frame) == 1 * 2 * 2 * 4
    assert set(frame["layer"]) == {2}
    assert frame["head"].unique().tolist() == [3, 1]
    expected = maps[frame["layer"] - 1, frame["head"] - 1, frame["query_index"], frame["key_index"]]
    np.testing.assert_array_equal(frame["weight"].to_numpy(), expected)
    assert frame["weight"].iloc[0] == 40.0  # layer 2, head 3, query 0, key 0


@pytest.mark.parametrize(("layers", "heads"), [([0], None), ([3], None), (None, [4])])
def test_long_form_rejects_layers_and_heads_that_do_not_exist(layers, heads):
    with pytest.raises(ValueError, match="numbers start at 1"):
        long_form(_numbered_maps(), ("<s>", "x"), ("a", "b", "c", "</s>"), layers=layers, heads=heads)


def test_long_form_rejects_mismatched_tokens():
    with pytest.raises(ValueError, match="4 key columns but 3 key tokens"):
        long_form(_numbered_maps(), ("<s>", "x"), ("a", "b", "</s>"))


# ---------------------------------------------------------------------------------------------
# downsample


def test_downsample_averages_blocks_and_reports_their_ranges():
    matrix = np.arange(7 * 5, dtype=float).reshape(7, 5)
    cells, rows, cols = downsample(matrix, 3)
    assert cells.shape == (3, 3)
    assert rows == [(0, 3), (3, 5), (5, 7)]
    assert cols == [(0, 2), (2, 4), (4, 5)]
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            assert cells[i, j] == pytest.approx(matrix[r0:r1, c0:c1].mean())
    areas = np.outer([r1 - r0 for r0, r1 in rows], [c1 - c0 for c0, c1 in cols])
    assert (cells * areas).sum() == pytest.approx(matrix.sum())


def test_downsample_preserves_the_mean_with_equal_blocks():
    matrix = _softmax_maps((12, 8), seed=3)
    cells, rows, cols = downsample(matrix, 4)
    assert cells.shape == (4, 4)
    assert cells.mean() == pytest.approx(matrix.mean())
    assert all(r1 - r0 == 3 for r0, r1 in rows) and all(c1 - c0 == 2 for c0, c1 in cols)


def test_downsampled_attention_rows_sum_to_one_when_weighted_by_block_width():
    matrix = _softmax_maps((7, 5), seed=1)
    cells, _, cols = downsample(matrix, 3)
    widths = np.array([c1 - c0 for c0, c1 in cols])
    np.testing.assert_allclose(cells @ widths, np.ones(3), rtol=1e-6)


def test_downsample_limits_each_axis_separately_and_leaves_small_matrices_alone():
    tall = np.ones((50, 3)) / 3
    cells, rows, cols = downsample(tall, 8)
    assert cells.shape == (8, 3)
    assert rows[0] == (0, 7) and rows[-1] == (44, 50)
    small = _softmax_maps((3, 4))
    cells, rows, cols = downsample(small, 4)
    np.testing.assert_array_equal(cells, small)
    assert rows == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize(("matrix", "max_size"), [(np.ones((3, 3)), 0), (np.ones(3), 2), (np.ones((0, 3)), 2)])
def test_downsample_rejects_bad_input(matrix, max_size):
    with pytest.raises(ValueError):
        downsample(matrix, max_size)


def test_induction_is_the_weight_on_the_token_after_the_latest_earlier_occurrence():
    tokens = ("<s>", "a", "b", "c", "a", "b", "a")  # a at 4 follows 1; b at 5 follows 2; a at 6 follows 4
    rows, keys = induction_targets(tokens)
    assert rows.tolist() == [4, 5, 6] and keys.tolist() == [2, 3, 5]
    T = len(tokens)
    maps = np.tril(np.ones((T, T)))
    maps /= maps.sum(-1, keepdims=True)
    maps[rows] = 0.0
    maps[rows, keys] = [1.0, 0.5, 0.25]  # the rest of each row on the diagonal
    maps[rows, rows] += [0.0, 0.5, 0.75]
    s = _stats(_one_layer(maps), tokens, tokens, "decoder")
    assert s["induction"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert math.isnan(_stats(_one_layer(maps[:4, :4]), tokens[:4], tokens[:4], "decoder")["induction"])
