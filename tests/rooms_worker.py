"""A process that uses a rooms' store, for the tests that need several processes on one store.

    python tests/rooms_worker.py open WHERE                       -> {"code": ..., "secret": ...}
    python tests/rooms_worker.py drive WHERE CODE SECRET          -> publishes {"step": i} until killed
    python tests/rooms_worker.py hammer WHERE CODE SECRET NAME N  -> {"versions": [...], "errors": [...]}

WHERE is the SQLite store's folder, or a ``redis://`` address.

``attnviz.app``'s own ``__init__`` imports Streamlit and torch (seconds per process on a busy
machine); the rooms need neither, so the worker loads the rooms package alone.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
app = types.ModuleType("attnviz.app")
app.__path__ = [str(ROOT / "attnviz" / "app")]
sys.modules["attnviz.app"] = app

from attnviz.app.rooms import Limits, RoomError, Rooms, redis_store  # noqa: E402
from attnviz.app.rooms.redis_store import RedisStore  # noqa: E402
from attnviz.app.rooms.sqlite_store import SQLiteStore  # noqa: E402

# These processes check that writers on one store lose nothing, not how fast a store must answer
# (test_rooms.py does): a Redis call may wait past the app's 0.5 s on two loaded cores, and the
# Redis hammer test failed once in a loaded quick-tier run (its message not kept; this is the likely
# cause, not a proven one), so they allow 10 s.
redis_store.TIMEOUT_S = 10.0


def main(command: str, where: str, *args: str) -> None:
    store = RedisStore(where) if where.startswith("redis://") else SQLiteStore(where)
    rooms = Rooms(lambda: store, lambda: Limits(publishes_per_s=float("inf")))  # every change written at once
    if command == "open":
        room = rooms.open_room({"page": "home", "step": 0})
        print(json.dumps({"code": room.code, "secret": room.secret}), flush=True)
    elif command == "drive":
        code, secret = args
        step = 0
        while True:
            step += 1
            version = rooms.publish(code, secret, {"page": "decoding", "step": step})
            print(json.dumps({"step": step, "version": version}), flush=True)
    elif command == "hammer":
        code, secret, name, n = args
        versions, errors = [], []
        for i in range(int(n)):
            try:
                rooms.follow(code, f"{name}-{i % 5}")
                rooms.read(code)
                versions.append(rooms.publish(code, secret, {"writer": name, "step": i}))
            except RoomError as e:
                errors.append(str(e))
        print(json.dumps({"versions": versions, "errors": errors}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
