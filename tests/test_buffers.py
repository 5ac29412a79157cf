"""The pool of map memory (attnviz.buffers): lent again only once nobody holds the maps, and bounded."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from attnviz import buffers
from attnviz.buffers import MapBuffers
from attnviz.model import BLOCKS_FROM, attention

MB = 2**20


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MAP_POOL_MB", "64")
    return MapBuffers()


def test_memory_is_lent_again_once_the_maps_are_dropped(pool):
    maps = pool.empty((4, 256, 256))
    address = maps.data_ptr()
    del maps
    assert pool.empty((4, 256, 256)).data_ptr() == address


@pytest.mark.parametrize(
    "keep",
    [
        lambda t: t[1, 2:5],  # a view of the maps
        lambda t: t.numpy(),  # an array made from them
        lambda t: t.view(-1)[10:].reshape(-1, 2),  # a view of a view
        lambda t: [t.unbind(0)[3]],  # one layer, in a list
    ],
    ids=["view", "numpy", "view-of-view", "one-layer"],
)
def test_memory_that_any_view_still_uses_is_never_lent(pool, keep):
    maps = pool.empty((4, 256, 256))
    maps.fill_(7.0)
    kept = keep(maps)
    address = maps.data_ptr()
    del maps
    other = pool.empty((4, 256, 256))
    other.fill_(-1.0)
    assert other.data_ptr() != address
    held = kept[0] if isinstance(kept, list) else kept
    assert (np.asarray(held) == 7.0).all(), "the kept maps were overwritten"
    del kept, held, other
    assert pool.held_bytes()[0] == 0


def test_the_budget_bounds_what_is_kept_and_zero_keeps_nothing(pool, monkeypatch):
    a, b = pool.empty((10 * MB // 4,)), pool.empty((40 * MB // 4,))
    assert pool.held_bytes() == (50 * MB, 0)
    del a, b  # 50 MB unused, within 64
    assert pool.held_bytes() == (0, 50 * MB)
    c = pool.empty((30 * MB // 4,))  # fits the 40 MB buffer (at most twice its size)
    assert pool.held_bytes() == (40 * MB, 10 * MB)
    monkeypatch.setenv("ATTNVIZ_MAP_POOL_MB", "0")
    del c  # dropped maps go back at once
    assert pool.held_bytes() == (0, 0)


def test_a_much_smaller_request_takes_new_memory(pool):
    big = pool.empty((16 * MB // 4,))
    address = big.data_ptr()
    del big
    assert pool.empty((1 * MB // 4,)).data_ptr() != address  # would waste 15 of its 16 MB


def test_release_gives_back_what_is_unused(pool):
    used, unused = pool.empty((MB,)), pool.empty((2 * MB,))
    del unused
    pool.release()
    assert pool.held_bytes() == (4 * MB, 0)
    del used


def test_threads_never_share_a_buffer(pool):
    seen, errors = [], []

    def work(value: float) -> None:
        for _ in range(50):
            maps = pool.empty((64, 1024))
            maps.fill_(value)
            seen.append(maps.data_ptr())
            if not bool((maps == value).all()):
                errors.append(value)

    threads = [threading.Thread(target=work, args=(float(i),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(seen)) < len(seen), "no buffer was ever lent again"


def test_maps_written_into_lent_memory_are_exact_where_masked_too():
    """A buffer lent again holds the last maps' numbers: the blocked path must write every cell."""
    torch.manual_seed(0)
    H, T, Dh = 4, 1024, 16
    assert H * T * T >= BLOCKS_FROM  # the blocked path, whose maps come from the pool
    q, k, v = (torch.randn(1, H, T, Dh) for _ in range(3))
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    garbage = buffers.MAPS.empty((H, T, T))
    garbage.fill_(float("nan"))
    del garbage  # the next maps of this size are written into it
    with torch.no_grad():
        _, weights, _ = attention(q, k, v, mask, return_scores=False)
        reference = torch.softmax((q @ k.transpose(-1, -2) / Dh**0.5).masked_fill(~mask, float("-inf")), dim=-1)
    assert torch.isfinite(weights).all()
    assert (weights[..., ~mask[0, 0]] == 0).all()
    torch.testing.assert_close(weights, reference, atol=1e-6, rtol=1e-5)
