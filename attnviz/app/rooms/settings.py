"""The operator's settings for rooms, and the one place that chooses the store from them.

| setting | default | what it sets |
|---|---|---|
| ``ATTNVIZ_ROOMS_URL`` | unset | ``redis://host:port/db``: rooms live in that Redis (several machines) |
| ``ATTNVIZ_ROOMS_DIR`` | see below | the folder of the SQLite file every replica on this machine opens |
| ``ATTNVIZ_ROOM_HOURS`` | 3 | a room ends this long after it was opened |
| ``ATTNVIZ_ROOMS_OPEN`` | 100 | rooms open at once in one store (all replicas together) |
| ``ATTNVIZ_ROOMS_PER_MINUTE`` | 30 | rooms opened in any 60 seconds in one store |
| ``ATTNVIZ_ROOM_FOLLOWERS`` | 200 | screens following one room |
| ``ATTNVIZ_ROOM_PUBLISHES_PER_S`` | 10 | changes written per second per room (faster ones are coalesced) |
| ``ATTNVIZ_ROOM_STATE_KB`` | 64 | the size of one room's shared view (its JSON) |

The default folder is ``$XDG_CACHE_HOME/attnviz/rooms`` (``~/.cache/attnviz/rooms``): every
replica started by the same user on one machine shares it, and it outlives a restart.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

from attnviz.app.rooms.redis_store import RedisStore
from attnviz.app.rooms.sqlite_store import SQLiteStore
from attnviz.app.rooms.store import Store, StoreError

FOLLOW_WINDOW_S = 10.0  # a follower counts while its last heartbeat is this recent (pages send one a second)
ENDED_KEPT_S = 3600.0  # an ended or expired room still answers "ended" this long, then it is unknown


def _number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 and value != float("inf") else default


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
        """The `Limits` the operator set (a missing, unreadable or non-positive setting takes its default)."""
        base = cls()
        return cls(
            hours=_number("ATTNVIZ_ROOM_HOURS", base.hours),
            rooms_open=int(_number("ATTNVIZ_ROOMS_OPEN", base.rooms_open)),
            per_minute=int(_number("ATTNVIZ_ROOMS_PER_MINUTE", base.per_minute)),
            followers=int(_number("ATTNVIZ_ROOM_FOLLOWERS", base.followers)),
            publishes_per_s=_number("ATTNVIZ_ROOM_PUBLISHES_PER_S", base.publishes_per_s),
            state_bytes=int(_number("ATTNVIZ_ROOM_STATE_KB", base.state_bytes / 1024) * 1024),
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
            made = RedisStore(url) if url else SQLiteStore(folder)
            _chosen[(url, folder)] = made
        return made
