"""What the app keeps in memory for every session, bounded by bytes, not by entries.

A class server's memory grew by about 60 MB per distinct 1000-token input, because Streamlit's
caches count entries: 64 exports of a long input are gigabytes. `ByteBudget` counts what
each result holds (numpy arrays, tensors, tables, figures) and drops the least recently used ones
once the total passes ``ATTNVIZ_CACHE_MB`` (default `DEFAULT_MB`).

Results are handed to every session as they are, not copied: arrays in them are made read-only, so
that no page can change what another session sees.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from attnviz.settings import number_setting

DEFAULT_MB = 512


def budget_bytes() -> int:
    """The operator's budget, ``ATTNVIZ_CACHE_MB`` (a number of MB, 0 to a TB: `attnviz.settings`), else
    `DEFAULT_MB`."""
    return int(number_setting("ATTNVIZ_CACHE_MB", DEFAULT_MB, 0, 2**20) * 2**20)


def held_bytes(value: Any, seen: set[int] | None = None) -> int:
    """About how many bytes ``value`` holds: its arrays, tensors, tables, strings and figures, each once.

    Numpy arrays are made read-only on the way (results are shared between sessions).
    """
    seen = set() if seen is None else seen
    if id(value) in seen or value is None:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
        return value.nbytes
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a torch tensor, without importing torch
        return value.element_size() * value.numel()
    if hasattr(value, "memory_usage") and hasattr(value, "columns"):  # a pandas DataFrame
        return int(value.memory_usage(deep=True).sum())
    if hasattr(value, "to_plotly_json"):  # a plotly figure: what its JSON holds
        return held_bytes(value.to_plotly_json(), seen)
    if isinstance(value, (str, bytes)):
        return sys.getsizeof(value)
    if isinstance(value, dict):
        return sum(held_bytes(k, seen) + held_bytes(v, seen) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sys.getsizeof(value) + sum(held_bytes(v, seen) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(held_bytes(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    if hasattr(value, "__dict__"):
        return sys.getsizeof(value) + held_bytes(vars(value), seen)
    return sys.getsizeof(value)


class ByteBudget:
    """A process-wide memo of results under a budget of bytes, least recently used dropped first.

    ``get(key, make)`` returns the result kept for ``key`` or makes it: two sessions asking for the
    same key at once make it once. A result larger than the whole budget is returned but not kept.
    """

    def __init__(self, budget: Callable[[], int] = budget_bytes):
        self._budget = budget
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._making: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.total = 0  # bytes held

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.total = 0

    def drop(self, which: Callable[[Hashable], bool]) -> None:
        """Forget every result whose key ``which`` accepts (made again when next asked for)."""
        with self._lock:
            for key in [k for k in self._items if which(k)]:
                self.total -= self._items.pop(key)[1]

    def _take(self, key: Hashable):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return True, self._items[key][0]
            return False, None

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        found, value = self._take(key)
        if found:
            return value
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:  # one maker per key; the others wait and then find its result
            found, value = self._take(key)
            if found:
                return value
            try:
                value = make()
                # Kept before its maker's lock is let go: a session arriving in between (measuring a
                # figure takes milliseconds) would start a maker of its own and count the result twice.
                self._keep(key, value, held_bytes(value))
            finally:
                with self._lock:
                    self._making.pop(key, None)
            return value

    def _keep(self, key: Hashable, value: Any, size: int) -> None:
        budget = self._budget()
        with self._lock:
            if size > budget:
                return
            replaced = self._items.pop(key, None)
            if replaced is not None:  # counted once, whatever made it again
                self.total -= replaced[1]
            self._items[key] = (value, size)
            self.total += size
            while self.total > budget and self._items:
                _, (_, dropped) = self._items.popitem(last=False)
                self.total -= dropped
