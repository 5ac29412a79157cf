"""The mechanics page's numbers, each checked against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import seeded_model, tiny_config

from attnviz.errors import InputError
from attnviz.figures import teaching as tp
from attnviz.lessons import mechanics
from attnviz.model import MultiHeadAttention, attention
from attnviz.training.optim import learning_rate

X, W_Q, W_K, W_V = mechanics.DEFAULT_X, mechanics.DEFAULT_W_Q, mechanics.DEFAULT_W_K, mechanics.DEFAULT_W_V
# The default example worked on paper: row i of X picks and adds rows of each W.
HAND_Q = [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
HAND_K = [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
HAND_V = [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
HAND_SCORES = [[2, 4, 4], [4, 16, 12], [4, 12, 10]]  # Q K^T, unscaled


def hand_softmax(row):
    e = [math.exp(x) for x in row]
    return [x / sum(e) for x in e]


@pytest.mark.parametrize("scale", [True, False])
def test_default_worked_example_matches_the_hand_calculation(scale):
    ex = mechanics.worked_example(X, W_Q, W_K, W_V, scale=scale)
    np.testing.assert_array_equal(ex.Q, HAND_Q)
    np.testing.assert_array_equal(ex.K, HAND_K)
    np.testing.assert_array_equal(ex.V, HAND_V)
    divisor = math.sqrt(3) if scale else 1.0
    scores = [[s / divisor for s in row] for row in HAND_SCORES]
    weights = [hand_softmax(row) for row in scores]
    output = [[sum(w[j] * HAND_V[j][c] for j in range(3)) for c in range(3)] for w in weights]
    assert ex.divisor == divisor
    np.testing.assert_allclose(ex.scores, scores, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ex.weights, weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ex.output, output, rtol=0, atol=1e-12)
    assert ex.Q.dtype == np.float64


def test_worked_example_agrees_with_the_models_equation_1():
    rng = np.random.default_rng(3)
    x, wq, wk, wv = rng.normal(size=(5, 6)), rng.normal(size=(6, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 2))
    ex = mechanics.worked_example(x, wq, wk, wv)
    q, k, v = (torch.tensor(x @ w)[None, None] for w in (wq, wk, wv))  # (1, 1, n, d)
    out, weights, scores = attention(q, k, v, None)
    np.testing.assert_allclose(ex.scores, scores[0, 0].numpy(), atol=1e-12)
    np.testing.assert_allclose(ex.weights, weights[0, 0].numpy(), atol=1e-12)
    np.testing.assert_allclose(ex.output, out[0, 0].numpy(), atol=1e-12)


@pytest.mark.parametrize(
    "x, wq, wk, message",
    [
        ([[1, 2, 3]], W_Q, W_K, "4 rows"),  # 3 dimensions in X, 4 rows in W_Q
        (X, W_Q, [[1, 0], [0, 1], [1, 1], [0, 0]], "same shape"),
        ([[1, float("nan"), 0, 0]], W_Q, W_K, "fill every cell"),
        ([[1, "a", 0, 0]], W_Q, W_K, "numbers only"),
        ([[1e300, 0, 0, 0], [0, 1, 0, 0]], W_Q, W_K, "too large"),  # finite cells whose products overflow
        ([[1.7e308, 0, 0, 0]], W_Q, W_K, "too large"),
    ],
)
def test_worked_example_rejects_bad_matrices_with_a_message(x, wq, wk, message):
    with pytest.raises(InputError, match=message):
        mechanics.worked_example(x, wq, wk, W_V)


def test_scaling_comparison_keeps_the_ranking_and_flattens_the_softmax():
    scaled = mechanics.worked_example(X, W_Q, W_K, W_V, scale=True)
    unscaled = mechanics.worked_example(X, W_Q, W_K, W_V, scale=False)
    table = mechanics.scaling_comparison(scaled, unscaled)
    assert list(table["key it goes to"]) == list(unscaled.weights.argmax(axis=1))
    assert (table["entropy, scaled (nats)"] > table["entropy, unscaled (nats)"]).all()
    assert (table["largest weight, scaled"] < table["largest weight, unscaled"]).all()
    np.testing.assert_allclose(table["largest weight change"], np.abs(scaled.weights - unscaled.weights).max(1))
    # Query 1's unscaled row is softmax(4, 16, 12): its largest weight is e^16 / (e^4 + e^16 + e^12).
    p = hand_softmax([4, 16, 12])
    assert table["largest weight, unscaled"][1] == pytest.approx(p[1], abs=1e-12)
    assert table["entropy, unscaled (nats)"][1] == pytest.approx(-sum(x * math.log(x) for x in p), abs=1e-12)


def test_softmax_masks_exactly_and_gives_zeros_for_a_fully_masked_row():
    p = mechanics.softmax([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    np.testing.assert_allclose(p[0], [1 / (1 + math.e), 0, math.e / (1 + math.e)])
    assert p[0, 1] == 0.0
    np.testing.assert_array_equal(p[1], [0, 0, 0])


def test_softmax_jacobian_norm_matches_autograd():
    logits = torch.randn(4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
    for row in logits:
        jac = torch.autograd.functional.jacobian(lambda z: torch.softmax(z, -1), row)  # (7, 7)
        p = torch.softmax(row, -1).numpy()
        assert mechanics.softmax_jacobian_norm(p) == pytest.approx(float(jac.norm()), rel=1e-10)


def test_scaling_experiment_shows_variance_d_k_and_saturation_without_scaling():
    df = mechanics.scaling_experiment((1, 16, 256, 1024), n_keys=8, n_samples=1000, seed=0)
    assert list(df["d_k"]) == [1, 16, 256, 1024]
    np.testing.assert_allclose(df["variance of q·k"] / df["d_k"], 1.0, rtol=0.2)
    np.testing.assert_allclose(df["variance of q·k / √d_k"], 1.0, rtol=0.2)
    assert df["entropy, unscaled"].is_monotonic_decreasing
    assert df["largest weight, unscaled"].iloc[-1] > 0.9
    assert df["softmax gradient norm, unscaled"].iloc[-1] < 0.25 * df["softmax gradient norm, scaled"].iloc[-1]
    # Scaling keeps the softmax where it was. (At d_k = 1, q·k is a product of two normals, not yet
    # near-Gaussian, hence from 16 on.)
    for column in ("entropy, scaled", "largest weight, scaled", "softmax gradient norm, scaled"):
        assert np.ptp(df[df["d_k"] >= 16][column]) < 0.05, column
    assert (df["entropy, scaled"] < math.log(8)).all()
    assert df.attrs["uniform_entropy"] == pytest.approx(math.log(8))


def test_scaling_experiment_is_seeded():
    a = mechanics.scaling_experiment((4, 8), n_keys=3, n_samples=50, seed=1)
    b = mechanics.scaling_experiment((4, 8), n_keys=3, n_samples=50, seed=1)
    c = mechanics.scaling_experiment((4, 8), n_keys=3, n_samples=50, seed=2)
    assert a.equals(b) and not a.equals(c)


def test_padding_and_subsequent_masks_cell_by_cell():
    n, lengths = 5, [5, 3, 1]
    pad = mechanics.padding_mask(lengths, n)
    sub = mechanics.subsequent_mask(n)
    assert pad.shape == (3, n, n) and pad.dtype == bool
    for b, length in enumerate(lengths):
        for i in range(n):
            for j in range(n):
                assert pad[b, i, j] == (j < length)
                assert sub[i, j] == (j <= i)
    with pytest.raises(InputError, match="between 1 and n"):
        mechanics.padding_mask([6], n)


def test_apply_mask_to_row_zeroes_masked_keys_and_renormalises():
    scores = np.array([0.5, 2.0, -1.0, 3.0])
    allowed = np.array([True, True, True, False])
    table = mechanics.apply_mask_to_row(scores, allowed)
    kept = np.exp(scores[:3]) / np.exp(scores[:3]).sum()
    np.testing.assert_allclose(table["weight with mask"], [*kept, 0.0], atol=1e-15)
    assert table["weight with mask"].iloc[3] == 0.0
    assert table["masked score"].iloc[3] == -np.inf
    np.testing.assert_allclose(table["weight without mask"], np.exp(scores) / np.exp(scores).sum())
    # The same row through the model's equation 1 with the same mask.
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    k = torch.tensor(scores)[None, None, :, None]  # score_j = 1 * k_j / sqrt(1)
    _, weights, _ = attention(q, k, k, torch.tensor(allowed)[None, None, None])
    np.testing.assert_allclose(table["weight with mask"], weights[0, 0, 0].numpy(), atol=1e-15)
    none = mechanics.apply_mask_to_row(scores, np.zeros(4, dtype=bool))
    assert (none["weight with mask"] == 0).all()


def test_multihead_shapes_match_the_model_module():
    n, d_model, h = 7, 32, 4
    steps = dict((step, shape) for step, shape, _ in mechanics.multihead_shapes(n, d_model, h))
    mha = MultiHeadAttention(tiny_config(d_model=d_model, n_heads=h))
    x = torch.randn(1, n, d_model)
    q = mha.split_heads(mha.q_proj(x))  # (1, H, n, Dh)
    out, weights = mha(x, x, None, return_attention=True)
    assert steps["input X"] == (n, d_model)
    assert steps["split into heads"] == tuple(q.shape[1:]) == (h, n, d_model // h)
    assert steps["weights = softmax(scores)"] == tuple(weights.shape[1:])
    assert steps["Concat(head_1..head_h)"] == (n, d_model)
    assert steps["output = Concat(...) W^O"] == tuple(out.shape[1:])
    with pytest.raises(InputError, match="divisible"):
        mechanics.multihead_shapes(n, 30, 4)


def test_narrow_heads_cost_what_the_model_has_and_wide_heads_h_times_more():
    n, d_model, h = 9, 32, 4
    narrow, wide = mechanics.narrow_vs_wide_cost(n, d_model, h).to_dict("records")
    mha = MultiHeadAttention(tiny_config(d_model=d_model, n_heads=h, attn_bias=False))
    assert narrow["parameters"] == sum(p.numel() for p in mha.parameters()) == 4 * d_model**2
    assert wide["parameters"] == 4 * h * d_model**2
    assert narrow["d_k per head"] == 8 and wide["d_k per head"] == d_model
    assert narrow["multiply-adds: total"] == 4 * n * d_model**2 + 2 * n * n * d_model
    assert wide["multiply-adds: total"] == h * narrow["multiply-adds: total"]


def test_shuffled_order_is_a_seeded_non_identity_permutation():
    for n in (2, 3, 10):
        perm = mechanics.shuffled_order(n, seed=0)
        assert sorted(perm) == list(range(n)) and perm != tuple(range(n))
        assert perm == mechanics.shuffled_order(n, seed=0)
    assert mechanics.shuffled_order(1, 0) == (0,)


SRC = [5, 9, 7, 12, 5, 30, 2]  # "5" twice, as real sentences repeat tokens


@pytest.mark.parametrize("pos_encoding", ["sinusoidal", "learned"])
def test_permutation_is_exact_without_positions_and_broken_with_them(pos_encoding):
    model = seeded_model(tiny_config(pos_encoding=pos_encoding))
    before = {name: t.clone() for name, t in model.state_dict().items()}
    perm = mechanics.shuffled_order(len(SRC), seed=0)
    off = mechanics.permutation_check(model, SRC, perm, use_positions=False)
    on = mechanics.permutation_check(model, SRC, perm, use_positions=True)
    assert off.output_max_diff < 1e-6 and max(off.attention_max_diff) < 1e-6
    assert len(off.attention_max_diff) == model.cfg.n_enc_layers
    assert on.output_max_diff > 1e-2 and on.max_diff > 1e-2
    # expected() is P A P^T with P[i, perm[i]] = 1, built here as a matrix product.
    P = np.eye(len(SRC))[list(perm)]
    np.testing.assert_allclose(on.expected(), P @ on.attention @ P.T, atol=1e-15)
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items()), "the model was changed"
    assert next(model.parameters()).dtype == torch.float32


def test_the_pages_permutation_table_shows_the_maps_difference_in_the_maps_column():
    """The maps' column had shown max_diff, the encoder outputs' difference where larger: 2.6 on the shipped reverse
    with positions, for weights that lie in [0, 1]. Here each column is recomputed from the maps and outputs."""
    import attnviz

    bundle = attnviz.load("reverse", device="cpu")
    ids = bundle.tokenizer.encode_source("a t t e n t i o n").ids
    perm = tuple(range(len(ids) - 1, -1, -1))
    checks = {up: mechanics.permutation_check(bundle.model, ids, perm, up) for up in (False, True)}
    table = mechanics.permutation_table(checks).set_index("positional encoding")
    on = checks[True]
    maps_gap = np.abs(on.permuted_attention - on.expected()).max()
    assert 0.1 < maps_gap <= 1 < on.output_max_diff  # the comparison is well-posed: the two differ, far from rounding
    assert table.loc["on", "max |A(P x) − P A(x) Pᵀ|, every layer"] == pytest.approx(maps_gap, rel=1e-12)
    assert table.loc["on", "max |enc(P x) − P enc(x)|"] == on.output_max_diff
    assert table.loc["off", "max |A(P x) − P A(x) Pᵀ|, every layer"] < 1e-6


def test_permutation_in_float32_is_exact_to_the_rounding_only(tiny_model):
    perm = tuple(reversed(range(len(SRC))))
    check = mechanics.permutation_check(tiny_model, SRC, perm, use_positions=False, dtype=torch.float32)
    assert check.max_diff < 1e-5


def test_identity_permutation_changes_nothing_even_with_positions(tiny_model):
    check = mechanics.permutation_check(tiny_model, SRC, range(len(SRC)), use_positions=True)
    assert check.max_diff == 0.0


def test_permutation_check_rejects_an_order_of_the_wrong_length(tiny_model):
    with pytest.raises(InputError, match="ordering of 0..6"):
        mechanics.permutation_check(tiny_model, SRC, [0, 1, 2], use_positions=False)


def test_lr_schedule_is_equation_3_with_its_peak_at_warmup():
    d_model, warmup = 512, 4000
    df = mechanics.lr_schedule(d_model, warmup, 20_000)
    assert df["step"].iloc[0] == 1 and df["step"].iloc[-1] == 20_000
    peak = df.loc[df["learning rate"].idxmax()]
    assert peak["step"] == warmup
    assert peak["learning rate"] == pytest.approx(d_model**-0.5 * warmup**-0.5, rel=1e-12)
    rising = df[df["step"] <= warmup]["learning rate"]
    falling = df[df["step"] >= warmup]["learning rate"]
    assert rising.is_monotonic_increasing and falling.is_monotonic_decreasing
    step = int(df["step"].iloc[10])
    assert df["learning rate"].iloc[10] == learning_rate(step, d_model, warmup)
    assert df["learning rate"].iloc[-1] == pytest.approx(512**-0.5 * 20_000**-0.5)


def test_labelled_names_rows_and_columns():
    table = mechanics.labelled(np.arange(6).reshape(2, 3), "query", "key")
    assert list(table.index) == ["query 0", "query 1"] and list(table.columns) == ["key 0", "key 1", "key 2"]
    assert table.loc["query 1", "key 2"] == 5


# ---------------------------------------------------------------------------------------------
# The page's figures hold the numbers they claim, and every axis has a title.


def axis_titles(fig) -> list[str]:
    """The title of every axis; an axis that shares another's range (``matches``) counts as that one."""
    axes = [getattr(fig.layout, name) for name in fig.layout if name.startswith(("xaxis", "yaxis"))]
    return [a.title.text for a in axes if a.matches is None]


def assert_titled(fig) -> None:
    titles = axis_titles(fig)
    assert titles and all(titles), titles


def test_mask_grid_draws_each_mask_with_titled_axes():
    masks = {"padding mask": mechanics.padding_mask([2], 4)[0], "subsequent mask": mechanics.subsequent_mask(4)}
    fig = tp.mask_grid(masks)
    assert len(fig.data) == 2
    for trace, mask in zip(fig.data, masks.values(), strict=True):
        np.testing.assert_array_equal(trace.z, mask.astype(int))
    assert [a.text for a in fig.layout.annotations] == list(masks)
    assert_titled(fig)
    assert set(axis_titles(fig)) == {"key position", "query position"}


def test_masked_row_bars_show_both_rows():
    table = mechanics.apply_mask_to_row([1.0, 2.0, 3.0], [True, True, False])
    fig = tp.masked_row_bars(table, query=1)
    np.testing.assert_array_equal(fig.data[0].y, table["weight without mask"])
    np.testing.assert_array_equal(fig.data[1].y, table["weight with mask"])
    assert list(fig.data[1].x) == ["0", "1", "2 (masked)"]
    assert_titled(fig)


def test_scaling_figure_plots_every_column_against_d_k():
    df = mechanics.scaling_experiment((1, 4, 16), n_keys=4, n_samples=50)
    fig = tp.scaling_figure(df)
    assert len(fig.data) == 8  # four panels, with and without scaling
    plotted = {tuple(np.asarray(t.y)) for t in fig.data}
    for column in df.columns[1:]:
        assert tuple(df[column]) in plotted, column
    assert all(list(t.x) == [1, 4, 16] for t in fig.data)
    assert_titled(fig)


def test_lr_curve_and_head_cost_bars():
    df = mechanics.lr_schedule(512, 4000, 10_000)
    fig = tp.lr_curve(df, 4000)
    np.testing.assert_array_equal(fig.data[0].y, df["learning rate"])
    assert_titled(fig)
    cost = mechanics.narrow_vs_wide_cost(10, 64, 4)
    fig = tp.head_cost_bars(cost)
    assert [t.name for t in fig.data] == list(cost["attention"])
    assert list(fig.data[1].y) == [cost["parameters"][1], cost["multiply-adds: total"][1]]
    assert_titled(fig)


def test_permutation_figure_shows_both_maps_and_their_difference(tiny_model):
    check = mechanics.permutation_check(tiny_model, SRC, mechanics.shuffled_order(len(SRC), 0), True)
    a, b = check.permuted_attention[0, 1], check.expected()[0, 1]
    fig = tp.permutation_figure(a, b, [str(i) for i in range(len(SRC))], "layer 1, head 2")
    np.testing.assert_array_equal(fig.data[0].z, a)
    np.testing.assert_array_equal(fig.data[1].z, b)
    np.testing.assert_array_equal(fig.data[2].z, np.abs(a - b))
    assert_titled(fig)
    fig = tp.heatmap_row({"a": np.eye(2)}, labels=["▁the", "▁the"])
    assert list(fig.data[0].y) == ["0 ▁the", "1 ▁the"], "repeated tokens keep their own rows"
    with pytest.raises(ValueError, match="labels"):
        tp.heatmap_row({"a": np.eye(2)}, labels=["only one"])


@pytest.mark.parametrize(("d_k", "n_keys", "seed"), [(1, 2, 0), (64, 10, 0), (64, 20, 3), (1024, 5, 7)])
def test_one_query_weights_is_torch_softmax_of_the_same_draw(d_k, n_keys, seed):
    """Against torch's softmax of the same standard-normal draw, with and without 1/√d_k."""
    rng = np.random.default_rng(seed)
    q, keys = torch.from_numpy(rng.standard_normal(d_k)), torch.from_numpy(rng.standard_normal((n_keys, d_k)))
    for scale in (True, False):
        expected = torch.softmax((keys @ q) / (d_k**0.5 if scale else 1.0), dim=0).numpy()
        np.testing.assert_allclose(mechanics.one_query_weights(d_k, n_keys, seed, scale=scale), expected, rtol=1e-12)


def test_one_query_weights_saturate_without_scaling_and_refuse_bad_sizes():
    scaled, raw = (mechanics.one_query_weights(64, 10, 0, scale=s) for s in (True, False))
    assert raw.max() > scaled.max() and raw.max() > 0.9  # the paper's footnote 4 on one draw
    fig = tp.query_weights_bars(raw, 64, scale=False)
    assert "no scaling" in fig.layout.title.text and f"{raw.max():.3f}" in fig.layout.title.text
    with pytest.raises(InputError):
        mechanics.one_query_weights(64, 1)
