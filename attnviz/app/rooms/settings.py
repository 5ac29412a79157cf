"""The operator's settings for rooms, and the one place that chooses the store from them.

| setting | default | range | what it sets |
|---|---|---|---|
| ``ATTNVIZ_ROOMS_URL`` | unset | | ``redis://host:port/db``: rooms live in that Redis (several machines) |
| ``ATTNVIZ_ROOMS_DIR`` | see below | | the folder of the SQLite file every replica on this machine opens |
| ``ATTNVIZ_ROOM_HOURS`` | 3 | 1/60 to 8760 | a room ends this long after it was opened |
| ``ATTNVIZ_ROOMS_OPEN`` | 100 | 1 to 100,000 | rooms open at once in one store (all replicas together) |
| ``ATTNVIZ_ROOMS_PER_MINUTE`` | 30 | 1 to 10,000 | rooms opened in any 60 seconds in one store |
| ``ATTNVIZ_ROOM_FOLLOWERS`` | 200 | 1 to 100,000 | screens following one room |
| ``ATTNVIZ_ROOM_PUBLISHES_PER_S`` | 10 | 0.01 to 1,000,000 | changes written per second per room (faster: coalesced) |
| ``ATTNVIZ_ROOM_STATE_KB`` | 64 | 1 to 1024 | the size of one room's shared view (its JSON) |

A value that cannot be read, or is not above 0, takes the default; one outside its range takes the
nearest end of it (a lifetime of 1e306 hours had become infinity: rooms that opened and could not
be read). Either is said once in the log.

The default folder is ``$XDG_CACHE_HOME/attnviz/rooms`` (``~/.cache/attnviz/rooms``): every
replica started by the same user on one machine shares it, and it outlives a restart.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import urllib.parse
from pathlib import Path

from attnviz.app.rooms.redis_store import RedisStore
from attnviz.app.rooms.sqlite_store import SQLiteStore
from attnviz.app.rooms.store import Store, StoreError

log = logging.getLogger(__name__)

FOLLOW_WINDOW_S = 10.0  # a follower counts while its last heartbeat is this recent (pages send one a second)
ENDED_KEPT_S = 3600.0  # an ended or expired room still answers "ended" this long, then it is unknown
MOST_HOURS = 24 * 365  # a room's lifetime at most: a year (1e306 hours overflowed the stores' expiry times)
MOST_STATE_KB = 1024  # ATTNVIZ_ROOM_STATE_KB at most

_said: set[tuple[str, str]] = set()  # (setting, value) whose replacement the log has said: once per process


def _number(name: str, default: float, low: float, high: float) -> float:
    """The setting ``name`` from the environment, between ``low`` and ``high``; ``default`` when it is unset,
    unreadable or not above 0. A value replaced is said in the log once."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0:  # NaN, 0, negative
        used = default
        why = "is not a number above 0"
    else:
        used = min(max(value, low), high)
        why = f"is outside {low:g} to {high:g}"
    if used != value and (name, raw) not in _said:
        _said.add((name, raw))
        log.warning("%s=%r %s: the rooms use %g", name, raw[:40], why, used)
    return used


@dataclasses.dataclass(frozen=True)
class Limits:
    """The bounds on rooms, from the environment (read on every call: an operator's change applies at once)."""

    hours: float = 3.0  # ATTNVIZ_ROOM_HOURS: a room's lifetime
    rooms_open: int = 100  # ATTNVIZ_ROOMS_OPEN: rooms open at once per store
    per_minute: int = 30  # ATTNVIZ_ROOMS_PER_MINUTE: rooms opened per 60 s per store
    followers: int = 200  # ATTNVIZ_ROOM_FOLLOWERS: followers per room
    publishes_per_s: float = 10.0  # ATTNVIZ_ROOM_PUBLISHES_PER_S: writes of a room's state per second
    state_bytes: int = 64 * 1024  # ATTNVIZ_ROOM_STATE_KB: a room's state as JSON

    @classmethod
    def from_environment(cls) -> Limits:
        """The `Limits` the operator set, each within its range (a missing, unreadable or non-positive setting
        takes its default; see the module's table)."""
        base = cls()
        return cls(
            hours=_number("ATTNVIZ_ROOM_HOURS", base.hours, 1 / 60, MOST_HOURS),
            rooms_open=int(_number("ATTNVIZ_ROOMS_OPEN", base.rooms_open, 1, 100_000)),
            per_minute=int(_number("ATTNVIZ_ROOMS_PER_MINUTE", base.per_minute, 1, 10_000)),
            followers=int(_number("ATTNVIZ_ROOM_FOLLOWERS", base.followers, 1, 100_000)),
            publishes_per_s=_number("ATTNVIZ_ROOM_PUBLISHES_PER_S", base.publishes_per_s, 0.01, 1_000_000),
            state_bytes=int(_number("ATTNVIZ_ROOM_STATE_KB", base.state_bytes / 1024, 1, MOST_STATE_KB) * 1024),
        )


def rooms_dir() -> Path:
    """The folder of the SQLite store: ``ATTNVIZ_ROOMS_DIR``, else ``attnviz/rooms`` in the user's cache folder."""
    named = os.environ.get("ATTNVIZ_ROOMS_DIR", "").strip()
    if named:
        return Path(named).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache"
    return Path(cache) / "attnviz" / "rooms"


def describe_store() -> str:
    """Which store the configuration chooses, in words (for the operator's log and docs)."""
    url = os.environ.get("ATTNVIZ_ROOMS_URL", "").strip()
    return "Redis (ATTNVIZ_ROOMS_URL)" if url else f"SQLite in {rooms_dir()}"


_chosen: dict[tuple[str, str], Store] = {}
_lock = threading.Lock()


def store() -> Store:
    """The store the configuration names, made once per configuration; `StoreError` when it cannot be made."""
    url = os.environ.get("ATTNVIZ_ROOMS_URL", "").strip()
    folder = "" if url else str(rooms_dir())
    with _lock:
        made = _chosen.get((url, folder))
        if made is None:
            if url and not url.startswith(("redis://", "rediss://", "unix://")):
                raise StoreError("ATTNVIZ_ROOMS_URL must be a Redis address (redis://host:port/db)")
            if url:
                _check_database(url)
            made = RedisStore(url) if url else SQLiteStore(folder)
            _chosen[(url, folder)] = made
        return made


def _check_database(url: str) -> None:
    """`StoreError` unless the Redis database ``url`` names (its path, or ``?db=``) is a whole number from 0 up:
    redis-py drops one it cannot read, and the rooms would go to database 0 without a word."""
    parts = urllib.parse.urlsplit(url)
    named = [] if parts.scheme == "unix" else [parts.path.lstrip("/")]  # a socket's path is no database
    named += urllib.parse.parse_qs(parts.query, keep_blank_values=True).get("db", [])
    for database in named:
        if database and not (database.isascii() and database.isdigit() and int(database) < 2**31):
            raise StoreError(
                f"ATTNVIZ_ROOMS_URL names the Redis database {database[:40]!r}: a database is a whole number from 0 "
                "up (redis://host:port/0)"
            )
