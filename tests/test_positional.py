"""Positional encoding and the linearity of section 3.5, checked against independent computations.

The oracles are written out with ``math.sin``/``math.cos`` loops or ``np.linalg.lstsq``, never with
the functions under test; tolerances are float64 ones unless a float32 table is the point.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from conftest import seeded_model, tiny_config

from attnviz.errors import InputError
from attnviz.figures import positional as pp
from attnviz.lessons import positional as pe
from attnviz.model import PositionalEncoding, TransformerConfig

SIZES = [(2, 10.0), (8, 10000.0), (64, 10000.0), (128, 1e8), (512, 10000.0)]  # (d_model, base)


def formula(pos: float, dim: int, d_model: int, base: float = 10000.0) -> float:
    """Section 3.5 as written: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...)."""
    i = dim // 2
    angle = pos / math.pow(base, 2 * i / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


def formula_table(n: int, d_model: int, base: float, layout: str = "interleaved", start: int = 0) -> np.ndarray:
    table = np.array([[formula(start + p, j, d_model, base) for j in range(d_model)] for p in range(n)])
    if layout == "concat":
        table = np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)
    return table


def rotation_by_loops(k: float, d_model: int, base: float) -> np.ndarray:
    """M_k for the interleaved layout, entry by entry from angle addition."""
    M = np.zeros((d_model, d_model))
    for i in range(d_model // 2):
        phi = k / math.pow(base, 2 * i / d_model)
        M[2 * i, 2 * i], M[2 * i, 2 * i + 1] = math.cos(phi), math.sin(phi)
        M[2 * i + 1, 2 * i], M[2 * i + 1, 2 * i + 1] = -math.sin(phi), math.cos(phi)
    return M


def lstsq_residual(X: np.ndarray, Y: np.ndarray) -> float:
    W, *_ = np.linalg.lstsq(X, Y, rcond=None)
    return float(np.linalg.norm(X @ W - Y) / np.linalg.norm(Y))


# ---------------------------------------------------------------------------------------------
# The table


@pytest.mark.parametrize("layout", pe.LAYOUTS)
@pytest.mark.parametrize("d_model,base", [(2, 10.0), (6, 100.0), (16, 10000.0), (32, 1e6)])
@pytest.mark.parametrize("start", [0, 1234])
def test_encoding_matrix_is_the_formula_of_section_3_5(layout, d_model, base, start):
    got = pe.encoding_matrix(40, d_model, base, layout, start=start)
    assert got.shape == (40, d_model) and got.dtype == np.float64
    np.testing.assert_allclose(got, formula_table(40, d_model, base, layout, start), rtol=0, atol=1e-10)


@pytest.mark.parametrize("layout", pe.LAYOUTS)
@pytest.mark.parametrize("n,d_model", [(1, 2), (50, 16), (300, 128), (1024, 512)])
def test_encoding_matrix_equals_the_table_the_model_adds(layout, n, d_model):
    kind = "sinusoidal" if layout == "interleaved" else "sinusoidal_concat"
    model_table = PositionalEncoding(TransformerConfig(d_model=d_model, n_heads=1, max_len=n, pos_encoding=kind)).table
    model_table = model_table.numpy()
    ours = pe.encoding_matrix(n, d_model, 10000.0, layout, dtype=np.float32)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, model_table, rtol=0, atol=1e-7)  # both: float64 angles, rounded table
    np.testing.assert_allclose(pe.encoding_matrix(n, d_model, layout=layout), model_table, rtol=0, atol=6e-8)


def test_float32_angles_lose_digits_at_large_positions_and_float64_angles_do_not():
    exact = formula_table(8, 16, 10000.0, start=100_000)
    rounded_table = pe.encoding_matrix(8, 16, start=100_000, dtype=np.float32)
    rounded_angles = pe.encoding_matrix(8, 16, start=100_000, dtype=np.float32, angle_dtype=np.float32)
    assert np.abs(rounded_table - exact).max() < 1e-7
    assert np.abs(rounded_angles - exact).max() > 1e-3


@pytest.mark.parametrize("d_model,base", SIZES)
def test_wavelengths_are_a_geometric_progression_from_two_pi(d_model, base):
    lam = pe.wavelengths(d_model, base)
    expected = [2 * math.pi * math.pow(base, 2 * i / d_model) for i in range(d_model // 2)]
    np.testing.assert_allclose(lam, expected, rtol=1e-13)
    np.testing.assert_allclose(lam[1:] / lam[:-1], math.pow(base, 2 / d_model), rtol=1e-12)
    assert lam[0] == pytest.approx(2 * math.pi) and lam[-1] < 2 * math.pi * base
    np.testing.assert_allclose(pe.frequencies(d_model, base), 2 * math.pi / lam, rtol=1e-13)


def test_a_column_repeats_after_its_wavelength():
    d_model, i = 8, 1
    lam = pe.wavelengths(d_model, 10.0)[i]
    pos = np.array([0.0, 1.7, 5.0])
    one = pe.angle_addition(pos, lam, i, d_model, 10.0)  # PE(pos + wavelength)
    np.testing.assert_allclose(one.sin_lhs, [formula(p, 2 * i, d_model, 10.0) for p in pos], atol=1e-12)


@pytest.mark.parametrize("d_model", [2, 8, 64])
def test_concat_is_the_interleaved_table_with_columns_reordered(d_model):
    perm = pe.layout_permutation(d_model)
    assert sorted(perm) == list(range(d_model))
    inter = pe.encoding_matrix(30, d_model, 100.0, "interleaved")
    concat = pe.encoding_matrix(30, d_model, 100.0, "concat")
    np.testing.assert_array_equal(concat, inter[:, perm])
    np.testing.assert_allclose(pe.similarity_matrix(concat), pe.similarity_matrix(inter), atol=1e-12)


def test_dimension_labels_name_the_function_and_the_pair():
    assert pe.dimension_label(0, 8) == "dim 0: sin, i = 0"
    assert pe.dimension_label(5, 8) == "dim 5: cos, i = 2"
    assert pe.dimension_label(1, 8, "concat") == "dim 1: sin, i = 1"
    assert pe.dimension_label(5, 8, "concat") == "dim 5: cos, i = 1"
    with pytest.raises(InputError, match="dimension"):
        pe.dimension_label(8, 8)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: pe.encoding_matrix(10, 7), "even"),
        (lambda: pe.encoding_matrix(10, 0), "even"),
        (lambda: pe.encoding_matrix(0, 8), "positive integer"),
        (lambda: pe.encoding_matrix(10, 8, base=0.0), "base"),
        (lambda: pe.encoding_matrix(10, 8, base=float("inf")), "base"),
        (lambda: pe.encoding_matrix(10, 8, layout="sin|cos"), "layout"),
        (lambda: pe.rotation_matrix(1, 9), "even"),
        (lambda: pe.angle_addition(0, 1, 4, 8), "pair index"),
        (lambda: pe.offset_ladder(0), "k_max"),
    ],
)
def test_bad_inputs_raise_input_errors_that_say_what_to_fix(call, message):
    with pytest.raises(InputError, match=message):
        call()


def test_random_table_is_seeded_and_scaled_like_the_sinusoids():
    a, b = pe.random_table(400, 64, seed=3), pe.random_table(400, 64, seed=3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, pe.random_table(400, 64, seed=4))
    assert (a**2).mean() == pytest.approx(0.5, rel=0.05)
    assert (pe.encoding_matrix(400, 64) ** 2).mean() == pytest.approx(0.5, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Similarity


def test_similarity_matrix_is_every_dot_product():
    table = pe.random_table(6, 4, seed=1)
    expected = [[sum(table[p, j] * table[q, j] for j in range(4)) for q in range(6)] for p in range(6)]
    np.testing.assert_allclose(pe.similarity_matrix(table), expected, atol=1e-12)
    cos = pe.similarity_matrix(table, cosine=True)
    norms = np.sqrt(np.diag(expected))
    np.testing.assert_allclose(cos, np.array(expected) / np.outer(norms, norms), atol=1e-12)
    np.testing.assert_allclose(np.diag(cos), 1.0)


@pytest.mark.parametrize("d_model,base", SIZES)
@pytest.mark.parametrize("cosine", [False, True])
def test_sinusoid_similarity_depends_on_the_offset_only(d_model, base, cosine):
    table = pe.encoding_matrix(200, d_model, base)
    profile = pe.similarity_by_offset(table, cosine)
    assert list(profile["offset"]) == list(range(200)) and list(profile["pairs"]) == list(range(200, 0, -1))
    assert profile["std"].max() < 1e-10 * d_model
    assert (profile["max"] - profile["min"]).max() < 1e-10 * d_model
    scale = d_model / 2 if cosine else 1.0
    expected = [sum(math.cos(k / math.pow(base, 2 * i / d_model)) for i in range(d_model // 2)) for k in range(200)]
    np.testing.assert_allclose(profile["mean"] * scale, expected, atol=1e-9 * d_model)


def test_similarity_by_offset_summarises_each_diagonal():
    table = pe.random_table(7, 4, seed=5)
    profile = pe.similarity_by_offset(table)
    for k in range(7):
        values = [float(table[p] @ table[p + k]) for p in range(7 - k)]
        row = profile.iloc[k]
        assert row["offset"] == k and row["pairs"] == len(values)
        assert row["mean"] == pytest.approx(sum(values) / len(values), abs=1e-12)
        assert (row["min"], row["max"]) == (pytest.approx(min(values)), pytest.approx(max(values)))
        assert row["std"] == pytest.approx(np.std(values), abs=1e-12)


def test_sinusoid_similarity_falls_off_with_distance():
    profile = pe.similarity_by_offset(pe.encoding_matrix(256, 128))
    mean = profile["mean"].to_numpy()
    assert mean[0] == pytest.approx(64.0)  # |PE(p)|^2 = d_model / 2
    assert np.all(np.diff(mean[:10]) < 0)  # strictly falling near the diagonal
    assert mean[1:].max() < mean[0] and mean[100:].max() < mean[1]


def test_random_table_similarity_depends_on_where_the_pair_is():
    profile = pe.similarity_by_offset(pe.random_table(200, 64, seed=0))
    assert profile.loc[1:50, "std"].min() > 1.0  # sqrt(64 * 0.25) = 4 expected: nothing like 1e-14


def test_offset_similarity_is_the_closed_form():
    k = np.array([0, 1, 7, 300])
    expected = [sum(math.cos(kk * math.pow(10000.0, -2 * i / 32)) for i in range(16)) for kk in k]
    np.testing.assert_allclose(pe.offset_similarity(k, 32), expected, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Linearity: M_k


@pytest.mark.parametrize("d_model,base", SIZES)
@pytest.mark.parametrize("k", [1, 2, 5, 50, 199])
def test_rotation_moves_every_position_by_k_in_float64(d_model, base, k):
    M = pe.rotation_matrix(k, d_model, base)
    np.testing.assert_allclose(M, rotation_by_loops(k, d_model, base), atol=1e-13)
    table = pe.encoding_matrix(400, d_model, base)
    check = pe.shift_residual(table, k, M)
    assert check.residual.shape == (400 - k,)
    assert check.residual.max() < 1e-5  # the bound; in fact about 1e-13
    assert check.residual.max() < 1e-11
    np.testing.assert_allclose(check.actual, formula_table(400, d_model, base)[k:], atol=1e-10)


@pytest.mark.parametrize("d_model,base", [(8, 10.0), (64, 10000.0), (256, 1e5)])
@pytest.mark.parametrize("k", [1, 13, 100])
def test_concat_rotation_is_the_permuted_block_rotation(d_model, base, k):
    perm = pe.layout_permutation(d_model)
    M_int = pe.rotation_matrix(k, d_model, base, "interleaved")
    M_cat = pe.rotation_matrix(k, d_model, base, "concat")
    P = np.eye(d_model)[perm]  # concat vector = P @ interleaved vector
    np.testing.assert_allclose(M_cat, P @ M_int @ P.T, atol=1e-15)
    check = pe.shift_residual(pe.encoding_matrix(300, d_model, base, "concat"), k, M_cat)
    assert check.residual.max() < 1e-11
    wrong = pe.shift_residual(pe.encoding_matrix(300, d_model, base, "concat"), k, M_int)
    assert wrong.residual.max() > 0.1  # the interleaved matrix does not fit the concatenated table


def test_rotations_compose_invert_and_are_orthogonal():
    d, base = 32, 10000.0
    M3, M4, M7 = (pe.rotation_matrix(k, d, base) for k in (3, 4, 7))
    np.testing.assert_allclose(M3 @ M4, M7, atol=1e-13)
    np.testing.assert_allclose(pe.rotation_matrix(0, d, base), np.eye(d), atol=0)
    np.testing.assert_allclose(pe.rotation_matrix(-3, d, base), M3.T, atol=1e-15)
    np.testing.assert_allclose(M7 @ M7.T, np.eye(d), atol=1e-13)
    nonzero = np.abs(pe.rotation_matrix(5, d, base)) > 0
    assert nonzero.sum() == 2 * d and not nonzero[0, 2:].any()  # 2x2 blocks on the diagonal only


def test_shift_residual_handles_negative_offsets_and_catches_a_wrong_map():
    table = pe.encoding_matrix(50, 16)
    back = pe.shift_residual(table, -4, pe.rotation_matrix(-4, 16))
    np.testing.assert_array_equal(back.positions, np.arange(4, 50))
    np.testing.assert_allclose(back.actual, table[:46])
    assert back.residual.max() < 1e-12
    wrong = pe.shift_residual(table, 4, pe.rotation_matrix(5, 16))
    assert wrong.residual.min() > 1e-3
    for k in (50, -50, 2.0):
        with pytest.raises(InputError, match="offset"):
            pe.shift_residual(table, k, pe.rotation_matrix(1, 16))
    with pytest.raises(InputError, match="M_k"):
        pe.shift_residual(table, 1, np.eye(8))


def test_a_float32_table_leaves_float32_rounding_only():
    table = pe.encoding_matrix(512, 128, dtype=np.float32)
    check = pe.shift_residual(table, 7, pe.rotation_matrix(7, 128))
    assert check.predicted.dtype == np.float32 and check.residual.dtype == np.float64
    assert 1e-9 < check.residual.max() < 1e-6


@pytest.mark.parametrize("d_model,base", SIZES)
@pytest.mark.parametrize("k", [1, 9, 120])
def test_angle_addition_both_sides_agree_with_the_table(d_model, base, k):
    pos = np.arange(200)
    table = formula_table(200 + k, d_model, base)
    for i in sorted({0, d_model // 4, d_model // 2 - 1}):
        both = pe.angle_addition(pos, k, i, d_model, base)
        np.testing.assert_allclose(both.sin_lhs, table[pos + k, 2 * i], atol=1e-10)
        np.testing.assert_allclose(both.cos_lhs, table[pos + k, 2 * i + 1], atol=1e-10)
        sin_rhs = table[pos, 2 * i] * table[k, 2 * i + 1] + table[pos, 2 * i + 1] * table[k, 2 * i]
        cos_rhs = table[pos, 2 * i + 1] * table[k, 2 * i + 1] - table[pos, 2 * i] * table[k, 2 * i]
        np.testing.assert_allclose(both.sin_rhs, sin_rhs, atol=1e-10)
        np.testing.assert_allclose(both.cos_rhs, cos_rhs, atol=1e-10)
        assert np.abs(both.sin_lhs - both.sin_rhs).max() < 1e-5
        assert np.abs(both.cos_lhs - both.cos_rhs).max() < 1e-5


def test_linearity_breaks_only_at_float_precision():
    starts = [0, 1_000, 100_000, 10_000_000]
    sweep = pe.linearity_by_start(5, 128, 10000.0, "interleaved", n=64, starts=starts)
    assert list(sweep.columns) == ["precision", "start", "max_residual"] and len(sweep) == 12
    by = {(r.precision, r.start): r.max_residual for r in sweep.itertuples()}
    assert all(by["float64", s] < 1e-5 for s in starts)
    assert all(by["float32 table", s] < 1e-6 for s in starts)
    assert by["float32 angles", 0] < 1e-4 and by["float32 angles", 10_000_000] > 0.1


# ---------------------------------------------------------------------------------------------
# Least squares


def test_fit_linear_map_recovers_a_known_map_and_matches_lstsq():
    rng = np.random.default_rng(0)
    X, A = rng.normal(size=(60, 5)), rng.normal(size=(3, 5))
    fit = pe.fit_linear_map(X, X @ A.T)
    np.testing.assert_allclose(fit.matrix, A, atol=1e-12)
    assert fit.residual < 1e-13
    Y = rng.normal(size=(60, 3))
    fit = pe.fit_linear_map(X, Y)
    W, *_ = np.linalg.lstsq(X, Y, rcond=None)
    np.testing.assert_allclose(fit.matrix, W.T, atol=1e-12)
    assert fit.residual == pytest.approx(lstsq_residual(X, Y), rel=1e-10)
    with pytest.raises(InputError, match="more positions than dimensions"):
        pe.fit_linear_map(X[:5], Y[:5])
    with pytest.raises(InputError, match="same number of rows"):
        pe.fit_linear_map(X, Y[:10])


@pytest.mark.parametrize("k", [1, 4, 30])
def test_fitted_map_for_sinusoids_is_m_k(k):
    d, base = 8, 10.0  # well-conditioned: every column varies a lot over 200 positions
    table = pe.encoding_matrix(200, d, base)
    fit = pe.fit_linear_map(table[:-k], table[k:])
    assert fit.residual < 1e-12
    np.testing.assert_allclose(fit.matrix, rotation_by_loops(k, d, base), atol=1e-10)


@pytest.mark.parametrize("d_model,base", [(16, 10.0), (64, 10000.0), (128, 10000.0), (256, 1e8)])
def test_fit_residual_is_rounding_for_sinusoids_and_large_for_random_tables(d_model, base):
    ks = [1, 2, 7, 40]
    n = 2 * d_model + 40
    sinus = pe.fit_residual_by_offset(pe.encoding_matrix(n, d_model, base), ks)
    assert sinus.shape == (4,) and sinus.max() < 1e-10
    noise = pe.fit_residual_by_offset(pe.random_table(n, d_model, seed=1), ks)
    assert noise.min() > 0.5  # about sqrt(1 - d / (n - 40)) = 0.71
    float32 = pe.fit_residual_by_offset(pe.encoding_matrix(n, d_model, base, dtype=np.float32), ks)
    assert float32.max() < 1e-6


def test_fit_residual_by_offset_matches_lstsq_per_offset():
    table = pe.random_table(90, 10, seed=2) + np.linspace(0, 1, 90)[:, None]
    ks = [0, 3, 20]
    m = 90 - 20
    expected = [lstsq_residual(table[:m], table[k : k + m]) for k in ks]
    np.testing.assert_allclose(pe.fit_residual_by_offset(table, ks), expected, rtol=1e-9, atol=1e-13)
    assert pe.fit_residual_by_offset(table, [0])[0] < 1e-13  # k = 0: the identity fits
    with pytest.raises(InputError, match="any table would fit exactly"):
        pe.fit_residual_by_offset(table, [85])
    with pytest.raises(InputError, match="non-negative"):
        pe.fit_residual_by_offset(table, [-1])


def test_offset_ladder_spans_one_to_k_max():
    for k_max in (1, 2, 5, 64, 128):
        ladder = pe.offset_ladder(k_max)
        assert ladder[0] == 1 and ladder[-1] == k_max and ladder == sorted(set(ladder))
        assert len(ladder) <= 13
    assert pe.offset_ladder(5) == [1, 2, 3, 4, 5]


# ---------------------------------------------------------------------------------------------
# A model's positions


@pytest.mark.parametrize("kind,layout", [("sinusoidal", "interleaved"), ("sinusoidal_concat", "concat")])
def test_model_positions_of_a_sinusoidal_model(kind, layout):
    model = seeded_model(tiny_config(pos_encoding=kind))
    got_kind, table = pe.model_positions(model)
    assert got_kind == kind and table.dtype == np.float64 and table.shape == (64, 32)
    np.testing.assert_allclose(table, pe.encoding_matrix(64, 32, layout=layout), atol=6e-8)


def test_model_positions_of_a_learned_model_copy_the_parameter():
    model = seeded_model(tiny_config(pos_encoding="learned"))
    kind, table = pe.model_positions(model)
    assert kind == "learned"
    np.testing.assert_array_equal(table, model.pos.table.detach().double().numpy())
    before = model.pos.table.detach().clone()
    table[:] = 0  # a copy: the shared model is never touched
    assert torch.equal(model.pos.table.detach(), before)
    assert pe.fit_residual_by_offset(table + 1, [1, 3]).max() < 1e-13  # constant rows: trivially linear
    residual = pe.fit_residual_by_offset(pe.model_positions(model).table, [1, 3])
    assert residual.min() > 0.3  # a fresh learned table is random: no linear shift


def test_model_positions_of_a_model_without_positions():
    assert pe.model_positions(seeded_model(tiny_config(pos_encoding="none"))) == ("none", None)
    assert pe.model_positions(object()) == ("none", None)


# ---------------------------------------------------------------------------------------------
# Figures: the right numbers, every axis titled


def assert_titled(fig: go.Figure) -> None:
    """A title, and a title on every x axis and on the (first) y axis; shared y axes need only one."""
    assert fig.layout.title.text
    axes = {"xaxis", "yaxis"} | {name for name in fig.layout.to_plotly_json() if name.startswith("xaxis")}
    titles = {name: fig.layout[name].title.text for name in axes}
    assert all(titles.values()), titles


def test_row_stride_keeps_heatmaps_under_the_cell_budget():
    assert pp.row_stride(128, 128) == 1
    for n, d in ((512, 1024), (500, 300), (7, 100_000)):
        s = pp.row_stride(n, d)
        assert math.ceil(n / s) * d <= pp.MAX_CELLS or s >= n
        assert s == 1 or math.ceil(n / (s - 1)) * d > pp.MAX_CELLS
    with pytest.raises(ValueError):
        pp.row_stride(0, 4)


def test_encoding_heatmap_shows_the_table_or_every_sth_row():
    table = pe.encoding_matrix(64, 16)
    fig = pp.encoding_heatmap(table, title="PE")
    assert_titled(fig)
    np.testing.assert_array_equal(fig.data[0].z, table.astype(np.float32))
    big = pe.encoding_matrix(512, 1024)
    fig = pp.encoding_heatmap(big)
    s = pp.row_stride(512, 1024)
    assert fig.data[0].z.size <= pp.MAX_CELLS and f"every {s}th position" in fig.layout.title.text
    np.testing.assert_array_equal(fig.data[0].y, np.arange(0, 512, s))
    np.testing.assert_array_equal(fig.data[0].z, big[::s].astype(np.float32))


def test_similarity_heatmap_and_layout_comparison_stay_small():
    sim = pe.similarity_matrix(pe.encoding_matrix(512, 64))
    fig = pp.similarity_heatmap(sim, "title")
    assert_titled(fig)
    assert fig.data[0].z.size <= pp.MAX_CELLS and fig.data[0].z[3, 5] == np.float32(sim[6, 10])
    fig = pp.layout_comparison(pe.encoding_matrix(512, 1024), pe.encoding_matrix(512, 1024, layout="concat"))
    assert_titled(fig)
    assert sum(t.z.size for t in fig.data) <= pp.MAX_CELLS and len(fig.data) == 2


def test_line_figures_hold_their_data_and_titles():
    table = pe.encoding_matrix(100, 20)
    fig = pp.dimension_curves(table, [4, 5], ["a", "b"])
    assert_titled(fig)
    assert [t.name for t in fig.data] == ["a", "b"]
    np.testing.assert_array_equal(fig.data[1].y, table[:, 5].astype(np.float32))
    lam = pe.wavelengths(20, 10000.0)
    fig = pp.wavelength_chart(lam, 10000.0)
    assert_titled(fig)
    assert fig.layout.yaxis.type == "log"
    np.testing.assert_array_equal(fig.data[0].y, lam)
    profile = pe.similarity_by_offset(table)
    fig = pp.offset_profile_chart(profile, "t", closed_form=pe.offset_similarity(profile["offset"], 20))
    assert_titled(fig)
    assert len(fig.data) == 4
    np.testing.assert_array_equal(fig.data[2].y, profile["mean"])


def test_linearity_figures_hold_their_data_and_titles():
    M = pe.rotation_matrix(3, 64)
    fig = pp.rotation_heatmap(M, 3)
    assert_titled(fig)
    assert fig.data[0].z.shape == (16, 16) and "first 16 of 64" in fig.layout.title.text
    check = pe.shift_residual(pe.encoding_matrix(40, 64), 3, M)
    predicted, actual = np.linspace(0, 1, 37), np.linspace(1, 2, 37)  # told apart, unlike a true check
    fig = pp.shift_chart(check.positions, predicted, actual, 3, "dim 2")
    assert_titled(fig)
    assert [t.name for t in fig.data] == ["PE(pos + k)", "M_k · PE(pos)"]
    np.testing.assert_array_equal(fig.data[0].y, actual.astype(np.float32))
    np.testing.assert_array_equal(fig.data[1].y, predicted.astype(np.float32))
    fig = pp.residual_chart(check.positions, {"k = 3": check.residual}, "t", "position", "error")
    assert_titled(fig)
    assert fig.layout.yaxis.type == "log" and fig.data[0].y.min() >= pp.LOG_FLOOR
    np.testing.assert_array_equal(fig.data[0].customdata, check.residual)  # exact values in the hover
    assert fig.layout.xaxis.type != "category"
    fig = pp.residual_chart(["0", "1,000"], {"a": [1e-3, 0.0]}, "t", "first position", "e", categorical_x=True)
    assert fig.layout.xaxis.type == "category"  # else plotly reads "1,000" as a number
    both = pe.angle_addition(np.arange(30), 3, 2, 64)
    fig = pp.angle_addition_chart(np.arange(30), both.sin_lhs, both.sin_rhs, both.cos_lhs, both.cos_rhs, 2)
    assert_titled(fig)
    assert len(fig.data) == 4 and "PE(pos+k, 4)" in fig.data[0].name
