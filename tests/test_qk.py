"""The Q-K embedding: what the translation and scaling keep, the exact distance ranking, and the projection.

The property implemented (attnviz.qk): in the transformed (d_k + 1)-dimensional space, for every
query, the keys it may attend to ordered by distance (nearest first) are the keys ordered by
attention weight (largest first), and distance^2 = constant - 2 * score for that query.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnviz
from attnviz.api import queries_keys
from attnviz.kinds import allowed
from attnviz.qk import distances, picture_agreement, qk_embedding, scores, transform


def softmax(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    x = np.where(mask, x, -np.inf) if mask is not None else x
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def assert_distance_ranks_keys_as_weight(embedding, weights, mask=None, min_gap=0.0) -> None:
    """For every query, over its allowed keys: nearer key <=> larger weight (pairs closer than ``min_gap`` skipped)."""
    d = distances(embedding)
    for row in range(weights.shape[0]):
        keys = np.arange(weights.shape[1]) if mask is None else np.flatnonzero(mask[row])
        w, dist = weights[row, keys], d[row, keys]
        i, j = np.triu_indices(len(keys), 1)
        clear = np.abs(w[i] - w[j]) > min_gap
        assert (np.sign(w[i] - w[j])[clear] == -np.sign(dist[i] - dist[j])[clear]).all(), f"query {row}"


@pytest.mark.parametrize("seed", range(4))
def test_distance_ranks_keys_exactly_as_attention_on_random_heads(seed):
    rng = np.random.default_rng(seed)
    d_k = int(rng.integers(2, 40))
    queries = rng.normal(size=(int(rng.integers(1, 30)), d_k)) * rng.uniform(0.1, 5)
    keys = rng.normal(size=(int(rng.integers(2, 40)), d_k)) * rng.uniform(0.1, 5) + rng.normal(size=d_k)
    embedding = qk_embedding(queries, keys)
    weights = softmax(scores(queries, keys))
    assert_distance_ranks_keys_as_weight(embedding, weights)
    # Stronger than a ranking: distance^2 + 2 * score is one constant per query.
    d2 = distances(embedding) ** 2 + 2 * scores(queries, keys)
    np.testing.assert_allclose(d2, np.broadcast_to(d2[:, :1], d2.shape), rtol=1e-9, atol=1e-9)


def test_translation_and_scaling_leave_every_softmax_unchanged():
    rng = np.random.default_rng(7)
    queries, keys = rng.normal(size=(9, 8)), rng.normal(size=(11, 8)) * 3 + 2
    q, k, translation, c = transform(queries, keys)
    np.testing.assert_allclose(softmax(q @ k.T), softmax(scores(queries, keys)), atol=1e-12)
    np.testing.assert_allclose(q.mean(axis=0), k.mean(axis=0), atol=1e-12)  # the centroids coincide
    spreads = [np.linalg.norm(x - x.mean(axis=0), axis=1).mean() for x in (q, k)]
    assert spreads[0] == pytest.approx(spreads[1])  # and the clouds spread equally around it
    assert c > 0 and translation.shape == (8,)


def test_translation_and_scaling_alone_do_not_rank_exactly():
    """Why attnviz adds the norm coordinate: without it a long key can be far from a query yet win its softmax."""
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(50, 8))
    keys = rng.normal(size=(20, 8)) * rng.uniform(0.2, 3.0, size=(20, 1))  # keys of very different norms
    q, k, _, _ = transform(queries, keys)
    plain = np.linalg.norm(q[:, None] - k[None], axis=-1)
    top = np.argmax(scores(queries, keys), axis=1)
    assert (np.argmin(plain, axis=1) != top).sum() >= 5, "for several queries the nearest key is not the top one"
    assert (np.argmin(distances(qk_embedding(queries, keys)), axis=1) == top).all(), "with the norm coordinate it is"


def test_the_projection_keeps_everything_when_there_is_nothing_to_drop():
    rng = np.random.default_rng(2)
    queries, keys = rng.normal(size=(6, 1)), rng.normal(size=(8, 1))  # d_k = 1: the space is 2-D already
    embedding = qk_embedding(queries, keys)
    assert embedding.explained == pytest.approx(1.0)
    np.testing.assert_allclose(distances(embedding, projected=True), distances(embedding), atol=1e-9)
    assert picture_agreement(embedding, softmax(scores(queries, keys))) == pytest.approx(1.0)
    assert embedding.points.shape == (14, 2) and embedding.queries.shape == (6, 2) and embedding.keys.shape == (8, 2)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_the_models_vectors_give_its_own_maps_and_rank_them(kind):
    bundle = attnviz.load("en-de", device="cpu")
    src, tgt = "Thursday, July 2, 1998", "Donnerstag, 2. Juli 1998"
    maps = getattr(attnviz.attention(bundle, src, tgt), kind)
    queries, keys = queries_keys(bundle, src, tgt)[kind]
    mask = allowed(kind, maps.shape[-2], maps.shape[-1])
    for layer in range(maps.shape[0]):
        for head in range(maps.shape[1]):
            q, k = queries[layer, head], keys[layer, head]
            weights = softmax(scores(q, k), mask)  # equation 1 from the recorded vectors
            np.testing.assert_allclose(weights, maps[layer, head], atol=1e-5)
            # The model's float32 weights tie where float64 ones differ by less than their rounding.
            assert_distance_ranks_keys_as_weight(qk_embedding(q, k), maps[layer, head], mask, min_gap=1e-6)


def test_bad_vectors_are_refused():
    with pytest.raises(ValueError, match="same width"):
        qk_embedding(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="at least one query"):
        qk_embedding(np.zeros((0, 4)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="finite"):
        qk_embedding(np.full((2, 4), np.nan), np.zeros((3, 4)))
