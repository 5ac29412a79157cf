"""The sinusoidal positional encoding of section 3.5, and why offsets are linear maps.

Section 3.5: PE(pos, 2i) = sin(pos / base^(2i/d_model)), PE(pos, 2i+1) = cos(pos / base^(2i/d_model)),
with base = 10000. The paper chose sinusoids "because we hypothesized it would allow the model to
easily learn to attend by relative positions, since for any fixed offset k, PE(pos+k) can be
represented as a linear function of PE(pos)". This module builds the table for any base, the
matrix M_k of that linear function (one 2x2 rotation per frequency), and the measurements the
teaching pages show: dot products by offset, shift residuals, least-squares fits for any table.

Everything is numpy, float64 unless a ``dtype`` says otherwise; no Streamlit. Shape letters:
N positions, D d_model, P = D / 2 frequency pairs, M position pairs in a fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from attnviz.errors import InputError
from attnviz.model import PAPER_BASE, sinusoid_frequencies, sinusoidal_table

LAYOUTS = ("interleaved", "concat")  # the paper's sin, cos, sin, cos... | all sines, then all cosines
# Precision of a table: (dtype of the table, dtype of the angles pos * omega_i), see encoding_matrix.
PRECISIONS = {
    "float64": (np.float64, np.float64),
    "float32 table": (np.float32, np.float64),  # what attnviz.model does: float64 angles, rounded table
    "float32 angles": (np.float32, np.float32),  # angles rounded too, as in many implementations
}


def _check(n: int | None, d_model: int, base: float, layout: str) -> None:
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
        raise InputError(f"the number of positions must be a positive integer, got {n!r}")
    if isinstance(d_model, bool) or not isinstance(d_model, (int, np.integer)) or d_model < 2 or d_model % 2:
        raise InputError(f"d_model must be an even integer of at least 2 (sin and cos pairs), got {d_model!r}")
    if not (np.isfinite(base) and base > 0):
        raise InputError(f"the base must be a positive finite number (the paper's is 10000), got {base!r}")
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def frequencies(d_model: int, base: float = PAPER_BASE) -> np.ndarray:
    """The P angular frequencies omega_i = base^(-2i/d_model), i = 0..P-1, from 1 down towards 1/base (3.5)."""
    _check(None, d_model, base, "interleaved")
    return sinusoid_frequencies(d_model, base)  # (P,)


def wavelengths(d_model: int, base: float = PAPER_BASE) -> np.ndarray:
    """The P wavelengths 2*pi*base^(2i/d_model), in positions: a geometric progression from 2*pi (3.5).

    Consecutive wavelengths differ by the factor base^(2/d_model); the last is just under 2*pi*base.
    """
    return 2 * np.pi / frequencies(d_model, base)


def layout_permutation(d_model: int) -> np.ndarray:
    """The column order that turns the interleaved table into the concatenated one.

    ``concat = interleaved[:, layout_permutation(d_model)]``: sines (even columns) first, then
    cosines (odd columns). Both layouts hold the same numbers, so any learned linear map that reads
    the encoding (W^Q, W^K, W^V, the first feed-forward layer) can absorb the permutation.
    """
    _check(None, d_model, PAPER_BASE, "interleaved")
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def encoding_matrix(
    n: int,
    d_model: int,
    base: float = PAPER_BASE,
    layout: str = "interleaved",
    start: int = 0,
    dtype=np.float64,
    angle_dtype=np.float64,
) -> np.ndarray:
    """The (N, D) sinusoid table of section 3.5 for positions start..start+N-1, any base, in ``dtype``.

    The model's own table (`attnviz.model.sinusoidal_table`, the one formula in attnviz) with
    the inputs checked for the page. The model computes the angles pos * omega_i in float64 and
    rounds the table to float32; ``angle_dtype`` float32 computes the angles themselves in float32,
    as many implementations do: at large positions they lose digits (about pos * 6e-8 radians),
    which is where linearity visibly breaks.
    """
    _check(n, d_model, base, layout)
    return sinusoidal_table(n, d_model, layout, base, start, dtype, angle_dtype)


def dimension_label(dim: int, d_model: int, layout: str = "interleaved") -> str:
    """'dim 5: cos, i = 2': which function and which frequency pair a column of the table holds."""
    _check(None, d_model, PAPER_BASE, layout)
    if not 0 <= dim < d_model:
        raise InputError(f"dimension must lie in [0, {d_model}), got {dim!r}")
    if layout == "interleaved":
        fn, i = ("sin" if dim % 2 == 0 else "cos"), dim // 2
    else:
        fn, i = ("sin" if dim < d_model // 2 else "cos"), dim % (d_model // 2)
    return f"dim {dim}: {fn}, i = {i}"


def random_table(n: int, d_model: int, seed: int = 0) -> np.ndarray:
    """An (N, D) table of independent normal entries with the sinusoids' mean square (1/2): a no-structure baseline."""
    _check(n, d_model, PAPER_BASE, "interleaved")
    return np.random.default_rng(seed).normal(0.0, np.sqrt(0.5), size=(n, d_model))


# ---------------------------------------------------------------------------------------------
# Similarity: PE(p) . PE(q) depends on p - q only, and falls off with the offset


def similarity_matrix(pe: np.ndarray, cosine: bool = False) -> np.ndarray:
    """The (N, N) matrix of dot products PE(p) . PE(q) of a table's rows (cosines with ``cosine``).

    For sinusoids PE(p) . PE(q) = sum_i cos((p - q) omega_i) (3.5): a function of the offset alone.
    Every row of a sinusoid table has norm sqrt(D/2), so the cosine is that divided by D/2.
    """
    pe = _table(pe)
    if cosine:
        norms = np.linalg.norm(pe, axis=1, keepdims=True)
        pe = pe / np.where(norms > 0, norms, 1.0)  # a zero row stays zero rather than NaN
    return pe @ pe.T  # (N, D) @ (D, N)


def similarity_by_offset(pe: np.ndarray, cosine: bool = False) -> pd.DataFrame:
    """One row per offset k = 0..N-1: mean, std, min and max of PE(p) . PE(p+k) over every p.

    A spread (std, max - min) of zero says the similarity depends on the offset only, as it does
    for sinusoids; for learned or random tables it depends on where the pair sits too. Negative
    offsets are not listed: PE(p) . PE(p-k) is the same set of pairs as offset k.
    """
    sim = similarity_matrix(pe, cosine)
    n = sim.shape[0]
    rows = []
    for k in range(n):
        values = np.diagonal(sim, offset=k)  # (N-k,) pairs (p, p+k)
        rows.append((k, values.mean(), values.std(), values.min(), values.max(), values.size))
    return pd.DataFrame(rows, columns=["offset", "mean", "std", "min", "max", "pairs"])


def offset_similarity(offsets, d_model: int, base: float = PAPER_BASE) -> np.ndarray:
    """The closed form sum_i cos(k omega_i) of PE(p) . PE(p+k) for sinusoids, per offset k (3.5)."""
    k = np.asarray(offsets, dtype=np.float64)
    return np.cos(k[..., None] * frequencies(d_model, base)).sum(axis=-1)


# ---------------------------------------------------------------------------------------------
# Linearity: PE(pos + k) = M_k PE(pos), with M_k independent of pos (3.5)


def rotation_matrix(k: float, d_model: int, base: float = PAPER_BASE, layout: str = "interleaved") -> np.ndarray:
    """The (D, D) matrix M_k with PE(pos + k) = M_k PE(pos) for every pos (section 3.5), float64.

    By angle addition each pair (sin(pos w), cos(pos w)) moves to (sin((pos+k) w), cos((pos+k) w))
    by the rotation [[cos kw, sin kw], [-sin kw, cos kw]], which involves k and w but not pos.
    Interleaved: these 2x2 blocks on the diagonal. Concat: the same matrix with rows and columns
    permuted by `layout_permutation` (sine i in column i, cosine i in column P + i).
    """
    _check(None, d_model, base, layout)
    phi = k * frequencies(d_model, base)  # (P,)
    c, s = np.cos(phi), np.sin(phi)
    m = np.zeros((d_model, d_model))
    sin_idx, cos_idx = np.arange(0, d_model, 2), np.arange(1, d_model, 2)
    m[sin_idx, sin_idx], m[sin_idx, cos_idx] = c, s  # sin(a+b) = sin a cos b + cos a sin b
    m[cos_idx, sin_idx], m[cos_idx, cos_idx] = -s, c  # cos(a+b) = cos a cos b - sin a sin b
    if layout == "concat":
        perm = layout_permutation(d_model)
        m = m[np.ix_(perm, perm)]
    return m


@dataclass(frozen=True)
class ShiftCheck:
    """M_k applied to PE(pos), against PE(pos + k), for every pos where both rows exist."""

    positions: np.ndarray  # (M,) row indices pos of the table
    predicted: np.ndarray  # (M, D) M_k PE(pos)
    actual: np.ndarray  # (M, D) PE(pos + k)
    residual: np.ndarray  # (M,) max over dimensions of |predicted - actual|, float64


def shift_residual(pe: np.ndarray, k: int, M: np.ndarray) -> ShiftCheck:
    """Per-position max |M_k PE(pos) - PE(pos + k)| over the table's rows, in the table's precision (3.5).

    ``k`` may be negative; the positions are those with both pos and pos + k in the table. The
    product is computed in ``pe``'s dtype, so a float32 table shows float32 rounding (about 1e-7
    per entry) and a float64 one shows float64 rounding.
    """
    pe = np.asarray(pe)
    if pe.ndim != 2:
        raise InputError(f"the table must be (positions, d_model), got shape {pe.shape}")
    n, d = pe.shape
    if M.shape != (d, d):
        raise InputError(f"M_k must be ({d}, {d}) for a table of width {d}, got {M.shape}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or abs(k) >= n:
        raise InputError(f"the offset k must be an integer with |k| < {n} (the table's length), got {k!r}")
    positions = np.arange(max(0, -k), min(n, n - k))
    predicted = pe[positions] @ M.astype(pe.dtype).T  # (M, D) @ (D, D): row form of M_k PE(pos)
    actual = pe[positions + k]
    residual = np.abs(predicted.astype(np.float64) - actual.astype(np.float64)).max(axis=1)
    return ShiftCheck(positions, predicted, actual, residual)


def linearity_by_start(
    k: int, d_model: int, base: float = PAPER_BASE, layout: str = "interleaved", n: int = 64, starts=(0,)
) -> pd.DataFrame:
    """Largest |M_k PE(pos) - PE(pos + k)| over n positions from each start, for every precision in PRECISIONS.

    Columns: precision, start, max_residual. M_k is exact for every pos (3.5): what grows with the
    start is rounding, dramatically so when the angles themselves are float32.
    """
    M = rotation_matrix(k, d_model, base, layout)
    rows = []
    for name, (dtype, angle_dtype) in PRECISIONS.items():
        for start in starts:
            table = encoding_matrix(n + abs(k), d_model, base, layout, int(start), dtype, angle_dtype)
            rows.append((name, int(start), float(shift_residual(table, k, M).residual.max())))
    return pd.DataFrame(rows, columns=["precision", "start", "max_residual"])


@dataclass(frozen=True)
class AngleAddition:
    """Both sides of the angle-addition identities behind M_k, per pos (arrays shaped like ``pos``)."""

    sin_lhs: np.ndarray  # PE(pos+k, 2i)
    sin_rhs: np.ndarray  # PE(pos, 2i) PE(k, 2i+1) + PE(pos, 2i+1) PE(k, 2i)
    cos_lhs: np.ndarray  # PE(pos+k, 2i+1)
    cos_rhs: np.ndarray  # PE(pos, 2i+1) PE(k, 2i+1) - PE(pos, 2i) PE(k, 2i)


def angle_addition(pos, k: float, i: int, d_model: int, base: float = PAPER_BASE) -> AngleAddition:
    """Both sides of PE(pos+k, 2i) = PE(pos, 2i) PE(k, 2i+1) + PE(pos, 2i+1) PE(k, 2i) and its cosine twin.

    The cosine: PE(pos+k, 2i+1) = PE(pos, 2i+1) PE(k, 2i+1) - PE(pos, 2i) PE(k, 2i). Here PE(k, .)
    is the encoding of the offset itself, so the coefficients of the linear map of section 3.5 are
    entries of a row of the table. ``pos`` may be a number or an array.
    """
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < d_model // 2:
        raise InputError(f"the pair index i must lie in [0, {d_model // 2}), got {i!r}")
    w = frequencies(d_model, base)[i]
    pos = np.asarray(pos, dtype=np.float64)
    sin_p, cos_p = np.sin(pos * w), np.cos(pos * w)  # PE(pos, 2i), PE(pos, 2i+1)
    sin_k, cos_k = np.sin(k * w), np.cos(k * w)  # PE(k, 2i), PE(k, 2i+1)
    return AngleAddition(
        sin_lhs=np.sin((pos + k) * w),
        sin_rhs=sin_p * cos_k + cos_p * sin_k,
        cos_lhs=np.cos((pos + k) * w),
        cos_rhs=cos_p * cos_k - sin_p * sin_k,
    )


# ---------------------------------------------------------------------------------------------
# Least squares: is there ONE linear map from PE(pos) to PE(pos + k) for every pos?


def _table(table) -> np.ndarray:
    array = np.asarray(table, dtype=np.float64)
    if array.ndim != 2 or 0 in array.shape:
        raise InputError(f"the table must be a non-empty (positions, d_model) matrix, got shape {array.shape}")
    return array


def _column_basis(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """U, s, Vt of X's thin SVD, truncated at numpy lstsq's default rank tolerance (eps * max(M, D))."""
    U, s, Vt = np.linalg.svd(X, full_matrices=False)
    rank = int((s > s[0] * np.finfo(np.float64).eps * max(X.shape)).sum()) if s.size and s[0] > 0 else 0
    return U[:, :rank], s[:rank], Vt[:rank]


def _relative_residual(Y: np.ndarray, U: np.ndarray) -> float:
    """||Y - U U^T Y|| / ||Y|| (Frobenius): what no linear function of X's columns explains."""
    norm = np.linalg.norm(Y)
    return float(np.linalg.norm(Y - U @ (U.T @ Y)) / norm) if norm > 0 else 0.0


class LinearFit(NamedTuple):
    """A least-squares linear map between two tables and how much it leaves unexplained."""

    matrix: np.ndarray  # (D_out, D_in) M with Y ~ X M^T, row by row y = M x
    residual: float  # ||X M^T - Y|| / ||Y||, Frobenius


def fit_linear_map(X: np.ndarray, Y: np.ndarray) -> LinearFit:
    """The least-squares M with Y ~ X M^T (rows are positions) and its relative residual: section 3.5's test.

    The minimum-norm solution (as ``np.linalg.lstsq``), computed from one SVD. A residual near 0
    means one fixed linear map takes every row of X to the matching row of Y. With no more rows
    than columns any table fits exactly, so the fit needs more position pairs than dimensions.
    """
    X, Y = _table(X), _table(Y)
    if X.shape[0] != Y.shape[0]:
        raise InputError(f"X and Y need the same number of rows (positions), got {X.shape[0]} and {Y.shape[0]}")
    if X.shape[0] <= X.shape[1]:
        raise InputError(
            f"{X.shape[0]} position pairs for {X.shape[1]} dimensions: any table fits exactly; "
            "use more positions than dimensions"
        )
    U, s, Vt = _column_basis(X)
    W = Vt.T @ ((U.T @ Y) / s[:, None])  # (D_in, D_out): X W ~ Y
    return LinearFit(matrix=W.T, residual=_relative_residual(Y, U))


def fit_residual_by_offset(table: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Per offset k in ``ks``: the relative residual of the best linear map from row pos to row pos + k.

    The fit for every k uses the same positions pos = 0..N-1-max(ks), so one SVD serves them all.
    Sinusoids give rounding-level residuals (section 3.5: M_k exists and does not depend on pos);
    a random table gives a large one; a learned table shows how far training got from linear.
    """
    table = _table(table)
    n, d = table.shape
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 0:
        raise InputError(f"offsets must be non-negative integers, got {ks!r}")
    m = n - max(ks)
    if m <= d:
        raise InputError(
            f"a table of {n} positions leaves {m} pairs at offset {max(ks)}, not more than its {d} dimensions, "
            "so any table would fit exactly; use a longer table or smaller offsets"
        )
    U, _, _ = _column_basis(table[:m])  # (M, rank)
    return np.array([_relative_residual(table[k : k + m], U) for k in ks])


def offset_ladder(k_max: int, count: int = 12) -> list[int]:
    """About ``count`` integer offsets from 1 to ``k_max``, spaced evenly on a log scale (always 1 and k_max)."""
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max < 1:
        raise InputError(f"k_max must be a positive integer, got {k_max!r}")
    return sorted({int(round(k)) for k in np.geomspace(1, k_max, count)})  # geomspace hits both ends exactly


# ---------------------------------------------------------------------------------------------
# A loaded model's positions


class ModelPositions(NamedTuple):
    """What a model adds to its embeddings for position: the kind and the table itself."""

    kind: str  # sinusoidal | sinusoidal_concat | learned | none (TransformerConfig.pos_encoding)
    table: np.ndarray | None  # (max_len, D) float64, or None when the model adds no positions


def model_positions(model) -> ModelPositions:
    """The position table a model adds to its embeddings (sinusoidal or learned) and its kind; None for 'none'.

    Works for any [`attnviz.model.Transformer`][]; the table is copied to the CPU as float64 and
    the model is not touched. The model adds it after scaling the embeddings by sqrt(d_model) (3.4).
    """
    pos = getattr(model, "pos", None)
    kind = getattr(pos, "kind", "none")
    table = getattr(pos, "table", None)
    if table is None:
        return ModelPositions(kind, None)
    return ModelPositions(kind, table.detach().to("cpu").double().numpy().copy())
