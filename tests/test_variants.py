"""Attention variants: exact pair counts, the Synthesizer's dependences, Table 1, timings, patterns on a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.errors import InputError
from attnviz.figures import teaching as tp
from attnviz.lessons import variants
from attnviz.lessons.mechanics import softmax

SIZES = [(1, 1), (2, 1), (7, 2), (7, 3), (16, 4), (33, 5), (10, 40)]


def allowed(name: str, i: int, j: int, k: int) -> bool:
    """The patterns' definitions, one pair at a time."""
    d = i - j
    return {
        "full": True,
        "causal": j <= i,
        "local": abs(d) < k,
        "dilated": d % k == 0,
        "sparse": abs(d) < k or d % k == 0,
    }[name]


@pytest.mark.parametrize("n, k", SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_patterns_cell_by_cell(n, k, causal):
    for name in variants.PATTERNS:
        mask = variants.pattern(name, n, k, causal)
        assert mask.shape == (n, n) and mask.dtype == bool
        expected = [[allowed(name, i, j, k) and (j <= i or not causal) for j in range(n)] for i in range(n)]
        np.testing.assert_array_equal(mask, expected, err_msg=name)
        assert mask.diagonal().all(), "every query keeps itself"


def closed_form(name: str, n: int, k: int) -> int:
    """Pairs counted by offset d = i - j: n - |d| pairs have offset d."""
    local = n + 2 * sum(n - d for d in range(1, min(k, n)))
    dilated = n + 2 * sum(n - d for d in range(k, n, k))
    return {"full": n * n, "causal": n * (n + 1) // 2, "local": local, "dilated": dilated}.get(
        name,
        local + dilated - n,  # sparse: only offset 0 is both within the window and a multiple of k
    )


@pytest.mark.parametrize("n, k", SIZES + [(100, 7), (1024, 32)])
def test_pair_counts_are_exact(n, k):
    for name in variants.PATTERNS:
        assert variants.pair_count(variants.pattern(name, n, k)) == closed_form(name, n, k), name
    assert variants.pair_count(variants.pattern("local", n, k, causal=True)) == sum(n - d for d in range(min(k, n)))


def test_cost_curves_hold_the_exact_counts_and_their_orders():
    df = variants.cost_curves((16, 64, 256), k=8)
    assert len(df) == 3 * len(variants.PATTERNS)
    for row in df.itertuples():
        assert row.pairs == closed_form(row.pattern, row.n, 8)
        assert row.order == variants.PATTERNS[row.pattern][1]
    local = df[df.pattern == "local"].set_index("n")["pairs"]
    full = df[df.pattern == "full"].set_index("n")["pairs"]
    assert local[256] / local[64] == pytest.approx(4, rel=0.05)  # linear in n
    assert full[256] / full[64] == 16  # quadratic


BAD = [("banded", 4, 1, "must be one of"), ("local", 0, 1, "n must"), ("local", 4, 0, "at least 1")]


@pytest.mark.parametrize("name, n, k, message", BAD)
def test_pattern_rejects_bad_arguments(name, n, k, message):
    with pytest.raises(InputError, match=message):
        variants.pattern(name, n, k)


def test_synthesizer_weights_are_rows_of_a_softmax():
    rng = np.random.default_rng(0)
    X, W1, W2, R = rng.normal(size=(5, 4)), rng.normal(size=(4, 6)), rng.normal(size=(6, 9)), rng.normal(size=(5, 5))
    dense = variants.synthesizer_dense(X, W1, W2)
    random = variants.synthesizer_random(R)
    for w in (dense, random):
        assert w.shape == (5, 5) and (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    hidden = np.where(X @ W1 > 0, X @ W1, 0)
    logits = hidden @ W2[:, :5]
    np.testing.assert_allclose(dense, np.exp(logits) / np.exp(logits).sum(1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(random, np.exp(R) / np.exp(R).sum(1, keepdims=True), atol=1e-12)
    with pytest.raises(InputError, match="maximum length"):
        variants.synthesizer_dense(X, W1, W2[:, :3])


def test_dense_synthesizer_row_depends_on_its_own_token_only():
    demo = variants.synthesizer_demo(n=6, d=5, seed=2)
    X2 = demo.X.copy()
    X2[[0, 3]] = X2[[3, 0]]  # swap tokens 0 and 3
    p = demo.params
    dense2 = variants.synthesizer_dense(X2, p["W1"], p["W2"])
    np.testing.assert_allclose(dense2[[3, 0]], demo.weights["dense synthesizer"][[0, 3]], atol=1e-15)
    np.testing.assert_array_equal(dense2[[1, 2, 4, 5]], demo.weights["dense synthesizer"][[1, 2, 4, 5]])
    # Dot-product attention is token-to-token: the same swap moves columns too.
    dot2 = softmax(variants.dot_product_scores(X2, p["W_Q"], p["W_K"]))
    swap = [3, 1, 2, 0, 4, 5]
    np.testing.assert_allclose(dot2, demo.weights["dot-product"][swap][:, swap], atol=1e-12)


def test_token_dependence_marks_row_and_column_row_or_nothing():
    n, token = 7, 4
    demo = variants.synthesizer_demo(n=n, d=6, seed=1)
    for w in demo.weights.values():
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    changed = variants.token_dependence(demo, token)
    row = np.zeros((n, n), dtype=bool)
    row[token] = True
    np.testing.assert_array_equal(changed["dot-product"], row | row.T)
    np.testing.assert_array_equal(changed["dense synthesizer"], row)
    assert not changed["random synthesizer"].any()
    with pytest.raises(InputError):
        variants.token_dependence(demo, n)


def test_complexity_table_is_the_papers_table_1():
    table = variants.complexity_table()
    assert list(table["layer type"]) == ["Self-Attention", "Recurrent", "Convolutional", "Self-Attention (restricted)"]
    assert list(table["complexity per layer"]) == ["O(n²·d)", "O(n·d²)", "O(k·n·d²)", "O(r·n·d)"]
    assert list(table["sequential operations"]) == ["O(1)", "O(n)", "O(1)", "O(1)"]
    assert list(table["maximum path length"]) == ["O(1)", "O(n)", "O(log_k(n))", "O(n/r)"]
    evaluated = variants.complexity_table(n=50, d=512, k=3, r=4)
    assert list(evaluated["operations at n=50, d=512"]) == [50 * 50 * 512, 50 * 512**2, 3 * 50 * 512**2, 4 * 50 * 512]
    assert list(evaluated["sequential steps"]) == [1, 50, 1, 1]
    assert list(evaluated["path length"]) == [1, 50, 4, 13]  # 3^3 = 27 < 50 <= 81 = 3^4; ceil(50 / 4)
    assert variants.complexity_table(n=9, d=1, k=3)["path length"][2] == 2  # exactly 3^2: no rounding up


def test_timing_reports_both_layers_and_leaves_the_rng_alone():
    state = torch.get_rng_state()
    df = variants.time_self_attention_vs_gru(ns=(4, 8), d=8, repeats=2, n_heads=2)
    assert torch.equal(torch.get_rng_state(), state)
    assert list(df.columns) == ["n", "layer", "median ms"]
    assert list(df["n"]) == [4, 4, 8, 8]
    assert set(df["layer"]) == {"self-attention", "recurrent (GRU)"}
    assert (df["median ms"] > 0).all()


SRC = [5, 9, 7, 12, 5, 30, 8, 2]


def test_full_pattern_on_the_model_changes_nothing(tiny_model):
    base = variants.encode_with_pattern(tiny_model, SRC, None, max_len=6)
    full = variants.encode_with_pattern(tiny_model, SRC, variants.pattern("full", len(SRC)), max_len=6)
    np.testing.assert_array_equal(full.maps, base.maps)
    assert full.output_ids == base.output_ids
    assert base.maps.shape == (2, 4, len(SRC), len(SRC))


@pytest.mark.parametrize("name, k", [("local", 2), ("dilated", 3), ("sparse", 2), ("causal", 1)])
def test_patterns_on_the_model_zero_masked_pairs_exactly(tiny_model, name, k):
    before = {key: t.clone() for key, t in tiny_model.state_dict().items()}
    mask = variants.pattern(name, len(SRC), k)
    run = variants.encode_with_pattern(tiny_model, SRC, mask, max_len=6)
    assert (run.maps[:, :, ~mask] == 0).all()
    np.testing.assert_allclose(run.maps.sum(-1), 1.0, atol=1e-6)
    assert all(torch.equal(before[key], t) for key, t in tiny_model.state_dict().items())


def test_a_window_of_one_makes_every_map_the_identity(tiny_model):
    run = variants.encode_with_pattern(tiny_model, SRC, variants.pattern("local", len(SRC), 1), max_len=4)
    np.testing.assert_array_equal(run.maps, np.broadcast_to(np.eye(len(SRC)), run.maps.shape))


def test_encode_with_pattern_rejects_a_mask_of_the_wrong_size(tiny_model):
    with pytest.raises(InputError, match="build it for n = 8"):
        variants.encode_with_pattern(tiny_model, SRC, variants.pattern("local", 5, 2))


def test_cost_figure_has_one_log_log_line_per_pattern():
    df = variants.cost_curves((16, 32), k=4)
    fig = tp.cost_figure(df, 4)
    assert [t.name for t in fig.data] == [f"{name}: {order}" for name, (_, order) in variants.PATTERNS.items()]
    for trace in fig.data:
        name = trace.name.split(":")[0]
        assert list(trace.y) == [closed_form(name, 16, 4), closed_form(name, 32, 4)]
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_timing_figure_and_heatmap_row():
    df = variants.time_self_attention_vs_gru(ns=(4, 8), d=8, repeats=1, n_heads=2)
    fig = tp.timing_figure(df)
    assert sorted(t.name for t in fig.data) == ["recurrent (GRU)", "self-attention"]
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    demo = variants.synthesizer_demo(n=4, d=3)
    fig = tp.heatmap_row(demo.weights)
    assert [a.text for a in fig.layout.annotations] == list(variants.METHODS)
    for trace, w in zip(fig.data, demo.weights.values(), strict=True):
        np.testing.assert_array_equal(trace.z, w)
    assert all(getattr(fig.layout, f"xaxis{i}").title.text for i in ("", "2", "3"))
    assert fig.layout.yaxis.title.text == "query" and fig.layout.yaxis2.matches == "y", "one shared, titled query axis"
