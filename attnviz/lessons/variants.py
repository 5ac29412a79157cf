"""Attention variants: sparse mask patterns, the Synthesizer, and the cost table of section 4.

Masks follow attnviz's one convention: boolean (n, n), rows are queries, columns keys, True = may
attend. Every pattern keeps the diagonal, so no query is left without a key. Patterns are
bidirectional, as the encoder is; ``causal=True`` intersects one with the subsequent mask, which is
how Child et al. (2019) use them in a decoder-only model.

Shape letters: n positions, d model width, S source length, L layers, H heads.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attnviz.decoding import greedy_decode, output_limit
from attnviz.errors import InputError
from attnviz.hooks import Edit, act_name, attention_site
from attnviz.kinds import causal_mask
from attnviz.lessons.mechanics import softmax
from attnviz.model import MultiHeadAttention, Transformer, TransformerConfig

PATTERNS = {
    "full": ("every query sees every key", "O(n²)"),
    "causal": ("query i sees keys 0..i (the decoder's subsequent mask)", "O(n²)"),
    "local": ("query i sees keys with |i - j| < k: itself and k - 1 neighbours on each side", "O(n·k)"),
    "dilated": ("atrous: query i sees every k-th key, i - j = 0, ±k, ±2k, ...", "O(n²/k)"),
    "sparse": ("local window k plus every k-th key (strided, Child et al. 2019)", "O(n·k + n²/k)"),
}
# Building an (n, n) mask costs n² bytes; beyond this a picture or a count is no longer cheap.
MAX_PATTERN_N = 4096


def pattern(name: str, n: int, k: int = 1, causal: bool = False) -> np.ndarray:
    """The (n, n) boolean mask of a named pattern (see `PATTERNS`); ``k`` is the window or stride."""
    if name not in PATTERNS:
        raise InputError(f"pattern must be one of {', '.join(PATTERNS)}; got {name!r}")
    if not 1 <= n <= MAX_PATTERN_N:
        raise InputError(f"n must be between 1 and {MAX_PATTERN_N}, got {n}")
    if k < 1:
        raise InputError(f"k (window or stride) must be at least 1, got {k}")
    offset = np.subtract.outer(np.arange(n), np.arange(n))  # (n, n): i - j, query minus key
    if name == "full":
        mask = np.ones((n, n), dtype=bool)
    elif name == "causal":
        mask = causal_mask(n)
    elif name == "local":
        mask = np.abs(offset) < k
    elif name == "dilated":
        mask = offset % k == 0
    else:
        mask = (np.abs(offset) < k) | (offset % k == 0)
    return mask & causal_mask(n) if causal else mask


def pair_count(mask: np.ndarray) -> int:
    """How many (query, key) pairs a mask lets attention compute: its True entries."""
    return int(np.count_nonzero(mask))


def cost_curves(ns=(16, 32, 64, 128, 256, 512, 1024), k: int = 8, causal: bool = False) -> pd.DataFrame:
    """Long form (n, pattern, order, pairs): the exact number of computed pairs of each pattern at each n."""
    rows = [
        {"n": n, "pattern": name, "order": order, "pairs": pair_count(pattern(name, n, k, causal))}
        for n in ns
        for name, (_, order) in PATTERNS.items()
    ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# The Synthesizer (Tay et al., 2020): attention weights without token-to-token dot products


def _finite(data, name: str, ndim: int) -> np.ndarray:
    a = np.asarray(data, dtype=np.float64)
    if a.ndim != ndim or not np.isfinite(a).all():
        raise InputError(f"{name} must be a finite array with {ndim} axes, got shape {a.shape}")
    return a


def dot_product_scores(X, W_Q, W_K) -> np.ndarray:
    """(n, n) scores (X W_Q)(X W_K)^T / sqrt(d_k): entry (i, j) depends on token i AND token j."""
    X, W_Q, W_K = _finite(X, "X", 2), _finite(W_Q, "W_Q", 2), _finite(W_K, "W_K", 2)
    return (X @ W_Q) @ (X @ W_K).T / math.sqrt(W_Q.shape[1])


def dense_scores(X, W1, W2) -> np.ndarray:
    """(n, n) Dense Synthesizer scores ReLU(X W1) W2: row i depends on token i alone.

    W1 is (d, d_hidden), W2 (d_hidden, l) for a maximum length l >= n; column j of the result is
    key position j, whatever token stands there. Biases are left out.
    """
    X, W1, W2 = _finite(X, "X", 2), _finite(W1, "W1", 2), _finite(W2, "W2", 2)
    n = X.shape[0]
    if W2.shape[1] < n:
        raise InputError(f"W2 has {W2.shape[1]} columns (the maximum length) but the input has {n} tokens")
    return np.maximum(X @ W1, 0.0) @ W2[:, :n]


def synthesizer_dense(X, W1, W2) -> np.ndarray:
    """Dense Synthesizer weights softmax(ReLU(X W1) W2): each token predicts its whole row alone."""
    return softmax(dense_scores(X, W1, W2))


def synthesizer_random(R) -> np.ndarray:
    """Random Synthesizer weights softmax(R): a fixed (trainable) (n, n) matrix, no input at all."""
    return softmax(_finite(R, "R", 2))


@dataclass(frozen=True)
class SynthesizerDemo:
    """One random input and the scores and weights of three ways to attend over it."""

    X: np.ndarray  # (n, d)
    params: dict[str, np.ndarray]  # W_Q, W_K (d, d); W1 (d, d); W2 (d, n); R (n, n)
    scores: dict[str, np.ndarray]  # method -> (n, n)
    weights: dict[str, np.ndarray]  # method -> (n, n), rows sum to 1


METHODS = ("dot-product", "dense synthesizer", "random synthesizer")


def _scores(X: np.ndarray, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "dot-product": dot_product_scores(X, params["W_Q"], params["W_K"]),
        "dense synthesizer": dense_scores(X, params["W1"], params["W2"]),
        "random synthesizer": params["R"].copy(),
    }


def synthesizer_demo(n: int = 6, d: int = 8, seed: int = 0) -> SynthesizerDemo:
    """Seeded standard-normal input (n, d) and parameters (scaled by 1/sqrt(fan-in)), all three methods."""
    if not (1 <= n <= 64 and 1 <= d <= 256):
        raise InputError(f"n must be between 1 and 64 and d between 1 and 256, got n = {n}, d = {d}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    shapes = {"W_Q": (d, d), "W_K": (d, d), "W1": (d, d), "W2": (d, n)}
    params = {name: rng.standard_normal(shape) / math.sqrt(shape[0]) for name, shape in shapes.items()}
    params["R"] = rng.standard_normal((n, n))
    scores = _scores(X, params)
    return SynthesizerDemo(X=X, params=params, scores=scores, weights={m: softmax(s) for m, s in scores.items()})


def token_dependence(demo: SynthesizerDemo, token: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Per method, the (n, n) scores that change when token ``token``'s vector is replaced.

    Dot-product: row ``token`` and column ``token`` (token-to-token); dense: row ``token`` only (a
    token sets its own row); random: nothing (the input is never read).
    """
    n = demo.X.shape[0]
    if not 0 <= token < n:
        raise InputError(f"token must be a position between 0 and {n - 1}, got {token}")
    X = demo.X.copy()
    X[token] = np.random.default_rng(seed).standard_normal(X.shape[1])
    after = _scores(X, demo.params)
    return {m: ~np.isclose(after[m], demo.scores[m], rtol=0.0, atol=1e-12) for m in METHODS}


# ---------------------------------------------------------------------------------------------
# Section 4, Table 1: why self-attention


def complexity_table(n: int | None = None, d: int | None = None, k: int = 3, r: int = 4) -> pd.DataFrame:
    """Table 1 of the paper; with ``n`` and ``d``, also each expression evaluated (kernel ``k``, neighbourhood ``r``).

    Constants are dropped as in the paper; the restricted path length n/r and the convolutional
    log_k(n) are rounded up.
    """
    table = pd.DataFrame(
        {
            "layer type": ["Self-Attention", "Recurrent", "Convolutional", "Self-Attention (restricted)"],
            "complexity per layer": ["O(n²·d)", "O(n·d²)", "O(k·n·d²)", "O(r·n·d)"],
            "sequential operations": ["O(1)", "O(n)", "O(1)", "O(1)"],
            "maximum path length": ["O(1)", "O(n)", "O(log_k(n))", "O(n/r)"],
        }
    )
    if n is not None and d is not None:
        if min(n, d, k, r) < 1 or k < 2:
            raise InputError(f"n, d and r must be positive and k at least 2, got n={n}, d={d}, k={k}, r={r}")
        table[f"operations at n={n}, d={d}"] = [n * n * d, n * d * d, k * n * d * d, r * n * d]
        table["sequential steps"] = [1, n, 1, 1]
        table["path length"] = [1, n, _ceil_log(n, k), math.ceil(n / r)]
    return table


def _ceil_log(n: int, k: int) -> int:
    """The smallest p >= 1 with k^p >= n: layers of width-k dilated convolutions to connect n positions."""
    p = 1
    while k**p < n:
        p += 1
    return p


def time_self_attention_vs_gru(ns=(16, 64, 256, 1024), d: int = 64, repeats: int = 5, n_heads: int = 4) -> pd.DataFrame:
    """Median milliseconds of one self-attention layer and one torch.nn.GRU layer on one sequence of n.

    Both have width ``d`` and run on the CPU, in inference mode. Self-attention is the fused kernel
    of `MultiHeadAttention`; the GRU must walk the n positions one after
    another. Each timing is after one warm-up call. Long form: n, layer, median ms.
    """
    if repeats < 1 or d < 2 or d % n_heads or min(ns) < 1:
        raise InputError(f"need repeats >= 1, positive n and d divisible by n_heads; got {repeats}, {ns}, {d}")
    with torch.random.fork_rng(devices=[]):  # seeded layers without touching the caller's RNG
        torch.manual_seed(0)
        attention = MultiHeadAttention(TransformerConfig(d_model=d, n_heads=n_heads, d_ff=d)).eval()
        gru = torch.nn.GRU(d, d, batch_first=True).eval()
        inputs = {n: torch.randn(1, n, d) for n in ns}
    layers = {"self-attention": lambda x: attention(x, x, None), "recurrent (GRU)": gru}
    rows = []
    with torch.inference_mode():
        for n in ns:
            x = inputs[n]
            for name, layer in layers.items():
                layer(x)  # warm-up: first calls allocate
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    layer(x)
                    times.append((time.perf_counter() - start) * 1000)
                rows.append({"n": n, "layer": name, "median ms": float(np.median(times))})
    df = pd.DataFrame(rows)
    df.attrs["threads"] = torch.get_num_threads()
    return df


# ---------------------------------------------------------------------------------------------
# A pattern on a real model


@dataclass(frozen=True)
class PatternRun:
    """The encoder's self-attention and the greedy output for one sentence under an extra mask."""

    maps: np.ndarray  # (L, H, S, S) encoder self-attention, float32
    output_ids: tuple[int, ...] | None  # greedy output without start and end tokens; None: encoder-only


@torch.no_grad()
def encode_with_pattern(model: Transformer, src_ids, mask: np.ndarray | None, max_len: int | None = None) -> PatternRun:
    """Encoder maps and greedy translation of one sentence with ``mask`` (S, S) ANDed into encoder
    self-attention (None: the model as trained). The model is only read, never changed: the mask is
    applied by an `Edit` of each encoder layer's mask point."""
    ids = torch.as_tensor(src_ids, dtype=torch.long).reshape(1, -1).to(model.device)  # (1, S)
    S = ids.shape[1]
    edits = {}
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (S, S):
            raise InputError(f"the mask is {mask.shape} but the sentence has {S} tokens: build it for n = {S}")
        extra = torch.as_tensor(mask, device=model.device)
        narrow = lambda m: extra if m is None else m & extra  # noqa: E731 - None: no padding to mask
        edits = {act_name(attention_site("encoder", i), "mask"): narrow for i in range(model.cfg.n_enc_layers)}
    with Edit(edits):
        _, weights = model.encode(ids, return_attention=True)
        maps = torch.stack([w[0] for w in weights]).float().cpu().numpy()
        if model.cfg.encoder_only:  # no decoder: the maps are the whole experiment
            return PatternRun(maps=maps, output_ids=None)
        limit = max_len if max_len is not None else output_limit(S, model.cfg.max_len)
        output = greedy_decode(model, ids, max_len=limit)[0]
    return PatternRun(maps=maps, output_ids=tuple(output))
