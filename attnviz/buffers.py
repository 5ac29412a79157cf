"""Memory for large attention maps, handed out again once nobody holds it: no page faults on every pass.

Why: a forward pass with every map writes L x H x T x T float32 numbers into new memory (576 MB for
GPT-2 small at 1024 tokens). A block that large comes from the operating system (glibc maps every
allocation over 32 MB afresh) and goes back when freed, so each pass pays a page fault for every
4 KB it writes. On a 2-core AMD EPYC (AVX2) one causal layer of SmolLM2's shape at 1024 tokens
took 43 ms to compute its maps into new memory and 21 ms into memory written before, the same as
the fused kernel that returns none (docs/benchmarks.md). Reading a corpus, an atlas, a snapshot
suite or a benchmark computes maps of the same sizes over and over.

`MapBuffers` keeps the memory of maps that nobody holds any more, and hands it out again.
Each buffer is a numpy array; the maps lent from it are a tensor over a numpy view of it
(``torch.from_numpy``), whose storage holds that view until the last tensor, view of a tensor or
array made from one that uses it is gone. The pool keeps a weak reference to the view: a buffer is
lent again only once it is dead. Maps the
caller keeps are never touched; they cost new memory as before.

What is kept is bounded: at most ``ATTNVIZ_MAP_POOL_MB`` (default `DEFAULT_MB`) of buffers
nobody holds, checked whenever maps are dropped; ``0`` keeps none, and memory then goes back when
the maps go, as without a pool. `release` gives every unused buffer back.
Only large float32 maps on the CPU come from here (the blocked path of `attnviz.model.attention`);
smaller ones are reused by the C allocator itself.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from attnviz.settings import number_setting

DEFAULT_MB = 1024
SLACK = 2  # a buffer serves a request of at least 1/SLACK of its size (a corpus's batches vary in length)


def keep_bytes() -> int:
    """The bytes of unused buffers the pool may keep: ``ATTNVIZ_MAP_POOL_MB`` MB (0 to a TB: `attnviz.settings`),
    else `DEFAULT_MB`."""
    return int(number_setting("ATTNVIZ_MAP_POOL_MB", DEFAULT_MB, 0, 2**20) * 2**20)


class _Buffer:
    """One buffer of the pool, and a weak reference to the view that the maps lent from it are made of."""

    def __init__(self, size: int):
        self.array = torch.empty(size, dtype=torch.float32).numpy()  # torch's allocator, as any tensor's
        self.lent: weakref.ref | None = None  # dead once nobody holds the maps

    @property
    def unused(self) -> bool:
        return self.lent is None or self.lent() is None

    def lend(self, shape: tuple[int, ...], n: int, returned: Callable[[weakref.ref], None]) -> Tensor:
        view = self.array[:n]
        self.lent = weakref.ref(view, returned)
        return torch.from_numpy(view).view(shape)  # the tensor's storage holds ``view`` until its last user goes


class MapBuffers:
    """A pool of float32 buffers for maps: `empty` lends an unused one of about the right size."""

    def __init__(self) -> None:
        self._buffers: list[_Buffer] = []  # every buffer the pool made and still keeps, used or not
        self._lock = threading.RLock()  # re-entrant: maps dropped inside the pool's own work call back

    def empty(self, shape: tuple[int, ...]) -> Tensor:
        """An uninitialised float32 CPU tensor of ``shape``, in an unused buffer when one fits."""
        n = math.prod(shape)
        with self._lock:
            self._trim(keep_bytes())
            fitting = [b for b in self._buffers if b.unused and n <= b.array.size <= SLACK * n]
            if fitting:
                chosen = min(fitting, key=lambda b: b.array.size)
            else:
                chosen = _Buffer(n)
                self._buffers.append(chosen)
            return chosen.lend(shape, n, self._returned)

    def _returned(self, _: weakref.ref) -> None:
        """Maps were dropped: keep their buffer only within the budget (with 0, free it now, as without a pool)."""
        with self._lock:
            self._trim(keep_bytes())

    def _trim(self, budget: int) -> None:
        """Drop unused buffers, largest first, until those left unused hold at most ``budget`` bytes."""
        unused = sorted((b for b in self._buffers if b.unused), key=lambda b: b.array.nbytes)
        total = sum(b.array.nbytes for b in unused)
        while unused and total > budget:
            dropped = unused.pop()
            self._buffers.remove(dropped)
            total -= dropped.array.nbytes
        # buffers in use stay listed: once their maps are dropped they can be lent again

    def release(self) -> None:
        """Give every unused buffer back (to the operating system, for large ones)."""
        with self._lock:
            self._trim(0)

    def held_bytes(self) -> tuple[int, int]:
        """(bytes of maps someone holds, bytes kept unused) in the buffers the pool made."""
        with self._lock:
            used = sum(b.array.nbytes for b in self._buffers if not b.unused)
            return used, sum(b.array.nbytes for b in self._buffers) - used


MAPS = MapBuffers()  # the process's pool; the maps of every model and thread come from it


def release() -> None:
    """Give the memory of maps nobody holds back to the operating system (`MAPS`)."""
    MAPS.release()
