"""Rooms across processes: replicas share a SQLite file (or a Redis), and a killed one loses nothing.

Each process here is a real Python process (`rooms_worker.py`) opening the same store, as
``deploy/serve.sh``'s replicas do.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from rooms_servers import RedisServer

from attnviz.app.rooms import Limits, Rooms
from attnviz.app.rooms.redis_store import RedisStore
from attnviz.app.rooms.sqlite_store import FILE_NAME, SQLiteStore

WORKER = Path(__file__).resolve().parent / "rooms_worker.py"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "redis"])
def where(request, tmp_path) -> str:
    """Where the processes' store is: a SQLite folder, or a Redis address."""
    if request.param == "sqlite":
        return str(tmp_path / "rooms")
    return request.getfixturevalue("redis_server").url


def store_at(where: str):
    return RedisStore(where) if where.startswith("redis://") else SQLiteStore(where)


def worker(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, text=True)


def answer(*args: str) -> dict:
    proc = worker(*args)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_a_room_opened_by_one_process_is_driven_by_another_after_a_kill(where):
    room = answer("open", where)
    store = store_at(where)
    here = Rooms(lambda: store, Limits)
    assert here.read(room["code"]).state == {"page": "home", "step": 0}

    driver = worker("drive", where, room["code"], room["secret"])
    seen = 0
    for line in driver.stdout:  # kill it while it writes, not between runs
        seen = json.loads(line)["step"]
        if seen >= 50:
            break
    driver.kill()
    driver.wait(timeout=30)
    view = here.read(room["code"])
    assert view.state["page"] == "decoding" and view.state["step"] >= seen
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(Path(where) / FILE_NAME) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    restarted = worker("drive", where, room["code"], room["secret"])  # the replica comes back
    first = json.loads(restarted.stdout.readline())
    restarted.kill()
    restarted.wait(timeout=30)
    assert first["version"] > view.version
    assert here.read(room["code"]).version >= first["version"]


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_two_processes_writing_at_once_lose_no_change(where):
    room = answer("open", where)
    n = 150
    procs = [worker("hammer", where, room["code"], room["secret"], name, str(n)) for name in ("a", "b")]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append(json.loads(out))
    for result in results:
        assert result["errors"] == []
        assert result["versions"] == sorted(set(result["versions"]))  # each process sees its versions rise
    every = results[0]["versions"] + results[1]["versions"]
    # Compare-and-set: no two writes got the same version, whichever process made them.
    assert len(set(every)) == len(every)
    store = store_at(where)
    view = Rooms(lambda: store, Limits).read(room["code"])
    assert view.version == max(every)
    assert view.followers == 10  # five heartbeat names per process
