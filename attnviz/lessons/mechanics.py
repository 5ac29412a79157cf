"""The mechanics of attention, step by step: the numbers behind the teaching page on section 3.2.

Everything here is plain numpy (float64, so a hand calculation matches to the last digit) except
`permutation_check`, which runs a [`Transformer`][attnviz.model.Transformer] without changing it.

Shape letters: n tokens, D d_model, Dk d_k (queries and keys), Dv d_v (values), H heads, S source
length, L layers.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attnviz.errors import InputError
from attnviz.hooks import Edit, act_name
from attnviz.kinds import causal_mask
from attnviz.model import Transformer
from attnviz.training.optim import learning_rate

# The worked example of the teaching page: three tokens of four dimensions, d_k = d_v = 3.
DEFAULT_X = ((1, 0, 1, 0), (0, 2, 0, 2), (1, 1, 1, 1))
DEFAULT_W_Q = ((1, 0, 1), (1, 0, 0), (0, 0, 1), (0, 1, 1))
DEFAULT_W_K = ((0, 0, 1), (1, 1, 0), (0, 1, 0), (1, 1, 0))
DEFAULT_W_V = ((0, 2, 0), (0, 3, 0), (1, 0, 3), (1, 1, 0))


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis; -inf entries get weight 0, an all -inf row all zeros.

    The all-masked rule is the model's (`attnviz.model.attention`): zeros, not NaN.
    """
    scores = np.asarray(scores, dtype=np.float64)
    top = np.max(scores, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)  # an all -inf row: exp(-inf) = 0 everywhere
    e = np.exp(scores - top)  # subtracting the row maximum keeps exp from overflowing
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def _matrix(data, name: str) -> np.ndarray:
    """``data`` as a finite 2-D float64 array, or an [`InputError`][attnviz.errors.InputError] naming the matrix."""
    try:
        m = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"{name} must hold numbers only: {e}") from None
    if m.ndim != 2 or 0 in m.shape:
        raise InputError(f"{name} must be a non-empty matrix, got shape {m.shape}")
    if not np.isfinite(m).all():
        raise InputError(f"{name} has empty or non-finite cells: fill every cell with a number")
    return m


# ---------------------------------------------------------------------------------------------
# Equation 1 by hand


@dataclass(frozen=True)
class WorkedExample:
    """Every intermediate of softmax(Q K^T / sqrt(d_k)) V for one small input, float64."""

    Q: np.ndarray  # (n, Dk) = X W_Q
    K: np.ndarray  # (n, Dk) = X W_K
    V: np.ndarray  # (n, Dv) = X W_V
    scores: np.ndarray  # (n, n) = Q K^T / divisor: rows are queries, columns keys
    weights: np.ndarray  # (n, n) softmax of each row
    output: np.ndarray  # (n, Dv) = weights V
    divisor: float  # sqrt(d_k) with scaling, 1 without


def worked_example(X, W_Q, W_K, W_V, scale: bool = True) -> WorkedExample:
    """Equation 1 for input rows ``X`` (n, D) and projections W_Q, W_K (D, Dk) and W_V (D, Dv).

    With ``scale`` False the scores are the raw dot products, to compare with the paper's scaling.
    """
    X, W_Q, W_K, W_V = (_matrix(m, name) for m, name in ((X, "X"), (W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
    D = X.shape[1]
    for m, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")):
        if m.shape[0] != D:
            raise InputError(f"{name} has {m.shape[0]} rows but the input vectors have {D} dimensions: they must match")
    if W_Q.shape != W_K.shape:
        raise InputError(f"W_Q {W_Q.shape} and W_K {W_K.shape} must have the same shape: q . k needs equal d_k")
    divisor = math.sqrt(W_Q.shape[1]) if scale else 1.0
    with np.errstate(over="ignore", invalid="ignore"):  # huge cells overflow: said below, in words
        Q, K, V = X @ W_Q, X @ W_K, X @ W_V
        scores = Q @ K.T / divisor
        weights = softmax(scores)
        output = weights @ V
    if not all(np.isfinite(m).all() for m in (Q, K, V, scores, weights, output)):
        raise InputError(
            "these cells are too large: their products overflow the largest number a float can hold "
            f"(about {np.finfo(np.float64).max:.1e}); use smaller numbers"
        )
    return WorkedExample(Q=Q, K=K, V=V, scores=scores, weights=weights, output=output, divisor=divisor)


def labelled(matrix: np.ndarray, row_label: str, col_label: str) -> pd.DataFrame:
    """A matrix as a table whose rows and columns are named: 'query 0', 'key 1', 'dim 2'."""
    n_rows, n_cols = np.shape(matrix)
    return pd.DataFrame(
        matrix,
        index=[f"{row_label} {i}" for i in range(n_rows)],
        columns=[f"{col_label} {j}" for j in range(n_cols)],
    )


def scaling_comparison(scaled: WorkedExample, unscaled: WorkedExample) -> pd.DataFrame:
    """Per query row: how dividing by sqrt(d_k) changed the weights and the output.

    The scores shrink by the same factor everywhere, so the order of the keys never changes; what
    changes is how peaked the softmax is, and with it every weight and output row.
    """
    p, u = scaled.weights, unscaled.weights
    return pd.DataFrame(
        {
            "query": np.arange(len(p)),
            "largest weight, scaled": p.max(axis=1),
            "largest weight, unscaled": u.max(axis=1),
            "key it goes to": p.argmax(axis=1),
            "entropy, scaled (nats)": _entropy(p),
            "entropy, unscaled (nats)": _entropy(u),
            "largest weight change": np.abs(p - u).max(axis=1),
            "largest output change": np.abs(scaled.output - unscaled.output).max(axis=1),
        }
    )


def _entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats of each row of ``p`` (0 log 0 = 0)."""
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(axis=-1)


# ---------------------------------------------------------------------------------------------
# Why divide by sqrt(d_k) (the footnote of 3.2.1)


def scaling_experiment(d_ks=(1, 4, 16, 64, 256, 1024), n_keys: int = 10, n_samples: int = 1000, seed: int = 0):
    """Per d_k: the variance of q . k and the softmax's behaviour with and without 1/sqrt(d_k).

    q and the ``n_keys`` keys have independent standard-normal components, so q . k has mean 0 and
    variance d_k (the paper's footnote 4). Each sample is one query against ``n_keys`` keys; the
    columns are means over ``n_samples`` samples: the entropy (nats) and largest weight of the
    softmax, and the Frobenius norm of its Jacobian d softmax / d scores = diag(p) - p p^T, the
    factor every gradient through the softmax is multiplied by. Without scaling the softmax
    saturates as d_k grows: one weight near 1, entropy and Jacobian near 0 (vanishing gradients).
    """
    d_ks = [int(d) for d in d_ks]
    if not d_ks or min(d_ks) < 1:
        raise InputError(f"d_k values must be positive integers, got {d_ks}")
    if n_keys < 2 or n_samples < 2:
        raise InputError(f"need at least 2 keys and 2 samples, got {n_keys} keys and {n_samples} samples")
    rng = np.random.default_rng(seed)
    rows = []
    for d_k in d_ks:
        q = rng.standard_normal((n_samples, d_k))
        # One key at a time: (samples, keys, d_k) at once would be hundreds of MB for large d_k.
        dots = np.stack([(q * rng.standard_normal((n_samples, d_k))).sum(axis=-1) for _ in range(n_keys)], axis=1)
        row = {"d_k": d_k, "variance of q·k": dots.var(), "variance of q·k / √d_k": (dots / math.sqrt(d_k)).var()}
        for label, scores in (("scaled", dots / math.sqrt(d_k)), ("unscaled", dots)):
            p = softmax(scores)
            row[f"entropy, {label}"] = _entropy(p).mean()
            row[f"largest weight, {label}"] = p.max(axis=-1).mean()
            row[f"softmax gradient norm, {label}"] = softmax_jacobian_norm(p).mean()
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["n_keys"] = n_keys
    df.attrs["uniform_entropy"] = math.log(n_keys)
    return df


def one_query_weights(d_k: int, n_keys: int = 10, seed: int = 0, scale: bool = True) -> np.ndarray:
    """One random query's softmax weights (n_keys,) over ``n_keys`` random keys, scores divided by √d_k or not.

    The same draw as one sample of `scaling_experiment` would make (standard-normal components), so
    the toggle on the Why √d_k tab shows, for one query, what that tab's means say: at the paper's
    d_k = 64 the unscaled softmax puts nearly all its weight on one key.
    """
    if d_k < 1 or n_keys < 2:
        raise InputError(f"need d_k >= 1 and at least 2 keys, got d_k={d_k} and {n_keys} keys")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(d_k)
    keys = rng.standard_normal((n_keys, d_k))
    scores = keys @ q
    return softmax(scores / math.sqrt(d_k) if scale else scores)


def softmax_jacobian_norm(p: np.ndarray) -> np.ndarray:
    """The Frobenius norm of diag(p) - p p^T for each row p of ``p`` (..., K).

    Expanding the squares gives sum p^2 - 2 sum p^3 + (sum p^2)^2 without building the K x K matrix.
    """
    s2 = (p**2).sum(axis=-1)
    s3 = (p**3).sum(axis=-1)
    return np.sqrt(np.maximum(s2 - 2 * s3 + s2**2, 0.0))


# ---------------------------------------------------------------------------------------------
# Masks (3.2.3): boolean, True = may attend, as everywhere in attnviz


def padding_mask(lengths, n: int) -> np.ndarray:
    """(B, n, n) masks for a right-padded batch: query i may attend to key j when j < length.

    Padding is masked as a key only: a padded query row still attends to the real tokens, as in
    `attnviz.model.attention_masks`; its output is simply never used.
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if n < 1 or lengths.size == 0 or lengths.min() < 1 or lengths.max() > n:
        raise InputError(f"every length must be between 1 and n = {n}, got {lengths.tolist()}")
    keys = np.arange(n)[None, :] < lengths[:, None]  # (B, n): real tokens
    return np.broadcast_to(keys[:, None, :], (lengths.size, n, n)).copy()


def subsequent_mask(n: int) -> np.ndarray:
    """(n, n) mask of the decoder's self-attention: position i may attend to positions 0..i."""
    if n < 1:
        raise InputError(f"n must be at least 1, got {n}")
    return causal_mask(n)


def apply_mask_to_row(scores_row, mask_row) -> pd.DataFrame:
    """One query's scores before and after a mask: masked scores become -inf, so their weights are 0
    and the remaining weights are renormalised to sum to 1."""
    scores_row = np.asarray(scores_row, dtype=np.float64).reshape(-1)
    mask_row = np.asarray(mask_row, dtype=bool).reshape(-1)
    if scores_row.shape != mask_row.shape:
        raise InputError(f"{scores_row.size} scores but {mask_row.size} mask entries: give one per key")
    masked = np.where(mask_row, scores_row, -np.inf)
    return pd.DataFrame(
        {
            "key": np.arange(scores_row.size),
            "may attend": mask_row,
            "score": scores_row,
            "masked score": masked,
            "weight without mask": softmax(scores_row),
            "weight with mask": softmax(masked),
        }
    )


# ---------------------------------------------------------------------------------------------
# Multi-head attention (3.2.2)


def _check_heads(n: int, d_model: int, h: int) -> None:
    if min(n, d_model, h) < 1:
        raise InputError(f"n, d_model and h must be positive, got {n}, {d_model}, {h}")
    if d_model % h:
        raise InputError(f"d_model ({d_model}) must be divisible by the number of heads h ({h})")


def multihead_shapes(n: int, d_model: int, h: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(step, shape, what happens) for one multi-head self-attention over ``n`` tokens, in order."""
    _check_heads(n, d_model, h)
    d_k = d_model // h
    return [
        ("input X", (n, d_model), "one d_model-dimensional vector per token"),
        ("Q = X W^Q (and K, V)", (n, d_model), f"one (d_model, d_model) matrix: the {h} heads' W_i^Q side by side"),
        ("split into heads", (h, n, d_k), f"d_model = {d_model} is cut into h = {h} slices of d_k = {d_k}"),
        ("scores Q_i K_i^T / √d_k", (h, n, n), "every head compares every query with every key"),
        ("weights = softmax(scores)", (h, n, n), "each row sums to 1"),
        ("head_i = weights V_i", (h, n, d_k), "each head mixes its own d_v = d_k dimensional values"),
        ("Concat(head_1..head_h)", (n, h * d_k), "the heads side by side again: h d_v = d_model"),
        ("output = Concat(...) W^O", (n, d_model), "W^O (h d_v, d_model) mixes the heads"),
    ]


def narrow_vs_wide_cost(n: int, d_model: int, h: int) -> pd.DataFrame:
    """Parameters and multiply-adds of one self-attention layer, narrow (split) against wide heads.

    Narrow is the paper's: each head projects to d_k = d_model / h, so h heads cost about as much as
    one full-width head. Wide gives each head all d_model dimensions (d_k = d_model): h times the
    parameters and work. Biases are left out (they add 4 d_model or (3h + 1) d_model parameters).
    """
    _check_heads(n, d_model, h)
    rows = []
    for name, d_k in (("narrow (split, the paper)", d_model // h), ("wide (every head sees all)", d_model)):
        projections = 3 * d_model * h * d_k + h * d_k * d_model  # W^Q, W^K, W^V and W^O
        proj_macs = n * projections  # every token through every projection
        attn_macs = 2 * h * n * n * d_k  # Q K^T and weights V, per head
        rows.append(
            {
                "attention": name,
                "heads h": h,
                "d_k per head": d_k,
                "parameters": projections,
                "multiply-adds: projections": proj_macs,
                "multiply-adds: scores and mixing": attn_macs,
                "multiply-adds: total": proj_macs + attn_macs,
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Permutation equivariance: self-attention alone sees a bag of tokens


@dataclass(frozen=True)
class PermutationCheck:
    """Encoder outputs and maps for a sentence and for its tokens shuffled by ``perm``.

    With P the permutation matrix (P[i, perm[i]] = 1), a bag-of-words encoder satisfies
    enc(P x) = P enc(x) and A(P x) = P A(x) P^T in every layer and head.
    """

    perm: tuple[int, ...]
    use_positions: bool
    output_max_diff: float  # max |enc(P x) - P enc(x)|
    attention_max_diff: tuple[float, ...]  # per layer, max over heads of |A(P x) - P A(x) P^T|
    output_max_abs: float  # max |enc(x)|, for scale
    attention: np.ndarray  # (L, H, S, S) maps for x as given
    permuted_attention: np.ndarray  # (L, H, S, S) maps for P x

    @property
    def max_diff(self) -> float:
        return max(self.output_max_diff, *self.attention_max_diff)

    def expected(self) -> np.ndarray:
        """P A(x) P^T per layer and head: what the maps of P x are if order does not matter."""
        p = np.asarray(self.perm)
        return self.attention[:, :, p][:, :, :, p]


def permutation_table(checks: dict[bool, PermutationCheck]) -> pd.DataFrame:
    """The page's summary: without and with positions, how far the shuffled sentence's outputs and maps are from
    the shuffled originals. The maps' column is theirs alone: it had shown `max_diff`, the outputs' difference
    when larger (2.6 on reverse with positions, for weights that lie in [0, 1])."""
    return pd.DataFrame(
        {
            "positional encoding": ["off", "on"],
            "max |enc(P x) − P enc(x)|": [checks[up].output_max_diff for up in (False, True)],
            "max |A(P x) − P A(x) Pᵀ|, every layer": [max(checks[up].attention_max_diff) for up in (False, True)],
            "max |enc(x)|, for scale": [checks[up].output_max_abs for up in (False, True)],
        }
    )


def shuffled_order(n: int, seed: int) -> tuple[int, ...]:
    """A seeded random order of range(n) that is not the identity (for n > 1)."""
    if n < 1:
        raise InputError(f"n must be at least 1, got {n}")
    rng = np.random.default_rng(seed)
    for _ in range(100):
        perm = rng.permutation(n)
        if n == 1 or (perm != np.arange(n)).any():
            break
    return tuple(int(i) for i in perm)


@torch.no_grad()
def permutation_check(
    model: Transformer, src_ids, perm, use_positions: bool, dtype: torch.dtype = torch.float64
) -> PermutationCheck:
    """Shuffle a sentence's tokens by ``perm`` and compare the encoder with the shuffled original.

    ``src_ids`` is one sentence's ids (a sequence, or a (1, S) tensor). The model is only read; by
    default a float64 copy runs, because in float32 the shuffled keys are summed in another order
    and rounding alone differs by about 1e-7 times the size of the numbers: float64 shows that the
    property holds exactly, not just nearly.
    """
    if next(model.parameters()).dtype != dtype:
        model = copy.deepcopy(model).to(dtype)  # a private copy: the shared model is never changed
    ids = torch.as_tensor(src_ids, dtype=torch.long).reshape(1, -1).to(model.device)  # (1, S)
    S = ids.shape[1]
    p = np.asarray(perm, dtype=np.int64).reshape(-1)
    if sorted(p.tolist()) != list(range(S)):
        raise InputError(f"perm must be an ordering of 0..{S - 1} (one entry per token), got {p.tolist()}")
    index = torch.as_tensor(p, device=model.device)

    # Without positions: the position table's rows are replaced by zeros, so x + PE(pos) = x exactly.
    no_positions = {} if use_positions or model.pos.table is None else {act_name("src", "pos"): torch.zeros_like}

    def run(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        with Edit(no_positions):
            memory, weights = model.encode(x, return_attention=True)
        maps = torch.stack([w[0] for w in weights])  # (L, H, S, S)
        return memory[0].double().cpu().numpy(), maps.double().cpu().numpy()

    out, maps = run(ids)
    out_p, maps_p = run(ids[:, index])
    expected = maps[:, :, p][:, :, :, p]  # P A P^T: row i and column j are token perm[i], perm[j]
    return PermutationCheck(
        perm=tuple(int(i) for i in p),
        use_positions=use_positions,
        output_max_diff=float(np.abs(out_p - out[p]).max()),
        attention_max_diff=tuple(float(d) for d in np.abs(maps_p - expected).reshape(len(maps), -1).max(axis=1)),
        output_max_abs=float(np.abs(out).max()),
        attention=maps,
        permuted_attention=maps_p,
    )


# ---------------------------------------------------------------------------------------------
# The learning-rate schedule (5.3, equation 3)


def lr_schedule(d_model: int, warmup: int, steps: int, points: int = 400) -> pd.DataFrame:
    """Equation 3 at about ``points`` steps from 1 to ``steps``: linear warm-up, then 1/sqrt(step)."""
    if min(d_model, warmup, steps) < 1:
        raise InputError(f"d_model, warmup and steps must be positive, got {d_model}, {warmup}, {steps}")
    grid = np.unique(np.concatenate([np.linspace(1, steps, points).round(), [min(warmup, steps)]]).astype(int))
    return pd.DataFrame({"step": grid, "learning rate": [learning_rate(int(s), d_model, warmup) for s in grid]})
