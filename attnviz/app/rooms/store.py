"""The one small interface every rooms' store implements, and the in-process store the tests use.

The room logic (`attnviz.app.rooms.room`) needs two things of a store, and nothing else:

- **records**: a string value under a key, with a revision the store counts up on every write
  (so a write can be made on condition that nobody wrote since it read: compare-and-set), and a time
  to live after which the record is gone;
- **groups**: sets of members that each live for a while (the followers who sent a heartbeat in
  the last seconds, the rooms open now, the rooms opened in the last minute), counted, with an
  atomic "join unless the group already has ``most`` members".

One implementation per store: `MemoryStore` (one process: tests), `SQLiteStore` (one machine,
every replica opening the same file), `RedisStore` (several machines). `attnviz.app.rooms.settings`
chooses one from the operator's configuration.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Protocol

# A record's revision at most: a room written 10 times a second for a year reaches 3.2e8. Redis's scripts count
# in Lua, whose numbers are written back with 14 significant digits: 10**19 - 1 plus one had become "1e+19".
LAST_REVISION = 10**12


class StoreError(Exception):
    """The store cannot be reached or written (a Redis gone, a folder that cannot be written)."""


class Store(Protocol):
    """Records with revisions and time to live, and groups of members that expire."""

    clock: Callable[[], float]  # seconds, the same clock for every process sharing the store (time.time)

    def get(self, key: str) -> tuple[int, str] | None:
        """``(revision, value)`` of the record under ``key``; None when there is none (or it expired)."""

    def put(self, key: str, value: str, ttl: float, expect: int | None = None) -> int | None:
        """The record's new revision after writing ``value`` for ``ttl`` seconds; None when ``expect`` did not hold.

        ``expect``: None writes whatever is there; 0 writes only where there is no record; a revision
        writes only where the record still has that revision.
        """

    def join(self, group: str, member: str, ttl: float, most: int | None = None) -> bool:
        """Whether ``member`` is now in ``group`` for ``ttl`` seconds (renewed if it was already there).

        False, and nothing written, when ``member`` is not in the group and the group already has
        ``most`` live members.
        """

    def count(self, group: str) -> int:
        """How many members of ``group`` are alive."""

    def leave(self, group: str, member: str) -> None:
        """Take ``member`` out of ``group`` (nothing when it is not there)."""

    def check(self) -> None:
        """Nothing when the store answers; `StoreError` when it does not."""


class MemoryStore:
    """A `Store` in this process's memory: one process only (tests, a single local server)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self._records: dict[str, tuple[int, str, float]] = {}  # key -> (revision, value, expires)
        self._groups: dict[str, dict[str, float]] = {}  # group -> member -> expires
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[int, str] | None:
        with self._lock:
            found = self._records.get(key)
            if found is None or found[2] <= self.clock():
                return None
            return found[0], found[1]

    def put(self, key: str, value: str, ttl: float, expect: int | None = None) -> int | None:
        with self._lock:
            now = self.clock()
            found = self._records.get(key)
            revision = found[0] if found is not None and found[2] > now else 0
            if expect is not None and expect != revision:
                return None
            self._records[key] = (revision + 1, value, now + ttl)
            for old in [k for k, (_, _, expires) in self._records.items() if expires <= now]:
                del self._records[old]
            return revision + 1

    def join(self, group: str, member: str, ttl: float, most: int | None = None) -> bool:
        with self._lock:
            now = self.clock()
            members = self._live(group, now)
            if member not in members and most is not None and len(members) >= most:
                return False
            members[member] = now + ttl
            return True

    def count(self, group: str) -> int:
        with self._lock:
            return len(self._live(group, self.clock()))

    def leave(self, group: str, member: str) -> None:
        with self._lock:
            self._groups.get(group, {}).pop(member, None)

    def check(self) -> None:
        return None

    def _live(self, group: str, now: float) -> dict[str, float]:
        members = self._groups.setdefault(group, {})
        for gone in [m for m, expires in members.items() if expires <= now]:
            del members[gone]
        return members


def revision_of(raw) -> int:
    """A record's revision as the store gave it, a whole number from 1 to `LAST_REVISION`; `StoreError` for
    anything else (a store someone wrote into by hand), which the rooms turn into one line for the visitor
    (-1 had been read as a version, and 0 means no record to `Store.put`)."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if type(raw) is int:
        revision = raw
    elif isinstance(text, str) and re.fullmatch(r"\s*-?[0-9]{1,19}\s*", text):
        revision = int(text)
    else:
        revision = None
    if revision is not None and 1 <= revision <= LAST_REVISION:
        return revision
    raise StoreError(f"the store holds a revision that is not a whole number from 1 up: {str(raw)[:40]!r}")
