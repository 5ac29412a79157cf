"""The Q-K embedding of one head: its queries and keys drawn together in 2-D, so that distance reflects attention.

After AttentionViz (Yeh, Chen, Lee, Wattenberg and Viégas, 2023, "AttentionViz: A Global View of
Transformer Attention", arXiv:2305.03210): a head's query and key vectors are projected
jointly, after two changes that leave every softmax as it was:

1. **Scaling.** Queries are multiplied by c and keys divided by c: q . k does not change at all.
   c is chosen so that queries and keys spread equally far around their own centroids (the same
   mean distance to it), so that neither cloud is a dot beside the other. (AttentionViz equalises
   the mean norms instead; after the translation below those would differ again, the spreads do not.)
2. **Translation.** The keys are then moved so that their centroid is the queries' centroid:
   k -> k + t, t = mean q - mean k. Query q's scores all change by the same amount, q . t, and a
   softmax does not see a constant added to all its inputs.

So far AttentionViz. Distance then only approximately follows attention, since
|q - k|^2 = |q|^2 + |k|^2 - 2 q . k also grows with the key's norm. attnviz adds one coordinate
(a deviation from AttentionViz): every query gets 0 and key k gets sqrt(R^2 - |k|^2), with R the
largest key norm, so that every key has norm R and, **exactly**,

```text
|q - k|^2 = |q|^2 + R^2 - 2 (score(q, k) + q . t)     (t the translation, scaled)
```

For one query the first terms are constants: among the keys it may attend to, the nearer key has
the higher score, hence the larger attention weight, and the ranking of keys by distance equals
their ranking by weight. That holds in the full (d_k + 1)-dimensional space (``vectors``); the
2-D picture is its principal-component projection (PCA), which keeps a share of the spread
(``explained``) and the ranking only approximately (`picture_agreement` measures how well).

Scores are q . k / sqrt(d_k) (equation 1): both sides are divided by d_k ** (1/4) first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QKEmbedding:
    """One head's queries and keys, transformed and projected; queries come first in every array."""

    vectors: np.ndarray  # (Q + K, d_k + 1) float64: the transformed vectors, where distance ranks keys exactly
    points: np.ndarray  # (Q + K, 2) float64: their projection on the first two principal components
    n_queries: int
    explained: float  # share of the vectors' total variance the two components keep, 0..1
    translation: np.ndarray  # (d_k,): t, added to every key after the scaling
    scale: float  # c: queries multiplied by it, keys divided by it

    @property
    def queries(self) -> np.ndarray:
        return self.points[: self.n_queries]

    @property
    def keys(self) -> np.ndarray:
        return self.points[self.n_queries :]


def _check(queries: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    queries, keys = np.asarray(queries, dtype=np.float64), np.asarray(keys, dtype=np.float64)
    if queries.ndim != 2 or keys.ndim != 2 or queries.shape[1] != keys.shape[1]:
        raise ValueError(
            f"expected one head's queries (Q, d_k) and keys (K, d_k) of the same width, got {queries.shape} and "
            f"{keys.shape}"
        )
    if 0 in queries.shape or 0 in keys.shape:
        raise ValueError(
            f"there must be at least one query, one key and one dimension; got {queries.shape}, {keys.shape}"
        )
    if not (np.isfinite(queries).all() and np.isfinite(keys).all()):
        raise ValueError("query and key vectors must be finite")
    return queries, keys


def scores(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The scaled scores q . k / sqrt(d_k) of equation 1: (Q, K) float64, before any mask."""
    queries, keys = _check(queries, keys)
    return queries @ keys.T / np.sqrt(queries.shape[1])


def transform(queries: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(queries, keys, t, c) after the scaling and the translation, before the norm coordinate.

    Both come back divided by d_k ** (1/4) first, so that their dot products are the scaled scores
    plus, for each query, a constant; ``t`` is the translation added to every key.
    """
    queries, keys = _check(queries, keys)
    root = queries.shape[1] ** 0.25
    queries, keys = queries / root, keys / root
    spread_q = np.linalg.norm(queries - queries.mean(axis=0), axis=1).mean()
    spread_k = np.linalg.norm(keys - keys.mean(axis=0), axis=1).mean()
    c = float(np.sqrt(spread_k / spread_q)) if spread_q > 0 and spread_k > 0 else 1.0
    queries, keys = queries * c, keys / c
    translation = queries.mean(axis=0) - keys.mean(axis=0)
    return queries, keys + translation, translation, c


def qk_embedding(queries: np.ndarray, keys: np.ndarray) -> QKEmbedding:
    """The Q-K embedding of one head's ``queries`` (Q, d_k) and ``keys`` (K, d_k) (module docstring)."""
    q, k, translation, c = transform(queries, keys)
    key_norms_sq = (k * k).sum(axis=1)
    radius_sq = key_norms_sq.max()
    vectors = np.concatenate(
        [
            np.concatenate([q, np.zeros((len(q), 1))], axis=1),
            np.concatenate([k, np.sqrt(np.maximum(radius_sq - key_norms_sq, 0.0))[:, None]], axis=1),
        ]
    )  # (Q + K, d_k + 1): every key has norm R
    centred = vectors - vectors.mean(axis=0)
    _, singular, components = np.linalg.svd(centred, full_matrices=False)
    variance = singular**2
    points = centred @ components[:2].T  # at least one query and one key, d_k + 1 >= 2: two components exist
    explained = float(variance[:2].sum() / variance.sum()) if variance.sum() > 0 else 1.0
    return QKEmbedding(vectors, points, len(q), explained, translation, c)


def distances(embedding: QKEmbedding, projected: bool = False) -> np.ndarray:
    """(Q, K) Euclidean distance from each query to each key: in the full space, or in the 2-D picture."""
    space = embedding.points if projected else embedding.vectors
    q, k = space[: embedding.n_queries], space[embedding.n_queries :]
    return np.sqrt(np.maximum(((q[:, None, :] - k[None, :, :]) ** 2).sum(axis=-1), 0.0))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 of a 1-D array, ties in order of appearance."""
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks


def picture_agreement(embedding: QKEmbedding, weights: np.ndarray, allowed: np.ndarray | None = None) -> float:
    """How well the 2-D picture keeps the ranking: the mean over queries of the Spearman correlation
    between nearness in the picture and attention weight, over the keys each query may attend to.

    1 means that in the picture, for every query, nearer keys always get more attention (as they
    do in the full space); 0 means no relation. Queries with fewer than two allowed keys are left out.
    """
    weights = np.asarray(weights, dtype=np.float64)
    near = -distances(embedding, projected=True)
    allowed = np.ones(weights.shape, dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
    correlations = []
    for row in range(weights.shape[0]):
        keys = np.flatnonzero(allowed[row])
        if len(keys) < 2:
            continue
        a, b = _ranks(near[row, keys]), _ranks(weights[row, keys])
        a, b = a - a.mean(), b - b.mean()
        correlations.append(float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum())))
    return float(np.mean(correlations)) if correlations else float("nan")
