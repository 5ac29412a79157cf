"""The rooms' store on one machine: a SQLite file in WAL mode that every replica opens.

Several server processes (``deploy/serve.sh``'s replicas) open the same file. WAL mode lets readers
go on while one process writes; ``busy_timeout`` makes a writer wait for another's short
transaction instead of failing; each call is one short transaction (``BEGIN IMMEDIATE`` for a
write, so that a compare-and-set reads and writes under the same lock). A process killed half-way
loses nothing that was committed: the file, not a process, holds the rooms.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from attnviz.app.rooms.store import StoreError
from attnviz.app.rooms.store import revision_of as _revision

FILE_NAME = "rooms.sqlite3"
BUSY_MS = 2000  # a writer waits this long for another process's transaction before giving up
PURGE_ONE_IN = 50  # one write in this many also deletes every expired record

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, revision INTEGER NOT NULL, value TEXT NOT NULL,
                                    expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS members (grp TEXT NOT NULL, member TEXT NOT NULL, expires REAL NOT NULL,
                                    PRIMARY KEY (grp, member));
"""


class SQLiteStore:
    """A `Store` in ``folder/rooms.sqlite3``, shared by every process that names the same folder."""

    def __init__(self, folder: str | os.PathLike, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.path = Path(folder) / FILE_NAME
        self._lock = threading.Lock()  # one connection per process, used by one thread at a time
        self._db: sqlite3.Connection | None = None
        self._pid = -1

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None and self._pid == os.getpid():
            return self._db
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # in WAL mode: durable against a killed process
            db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the rooms' file {self.path}: {e}") from e
        self._db, self._pid = db, os.getpid()  # a forked child opens its own connection
        return db

    def _run(self, work: Callable[[sqlite3.Connection], object], write: bool):
        with self._lock:
            db = self._connect()
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = work(db)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
                return result
            except sqlite3.Error as e:
                self._db = None  # the next call opens the file afresh (it may have been replaced or repaired)
                with contextlib.suppress(sqlite3.Error):
                    db.close()
                raise StoreError(f"the rooms' file {self.path} cannot be used: {e}") from e

    def get(self, key: str) -> tuple[int, str] | None:
        now = self.clock()

        def work(db):
            return db.execute(
                "SELECT revision, value FROM records WHERE key = ? AND expires > ?", (key, now)
            ).fetchone()

        found = self._run(work, write=False)
        return (_revision(found[0]), str(found[1])) if found else None

    def put(self, key: str, value: str, ttl: float, expect: int | None = None) -> int | None:
        now = self.clock()

        def work(db):
            found = db.execute("SELECT revision FROM records WHERE key = ? AND expires > ?", (key, now)).fetchone()
            revision = _revision(found[0]) if found else 0
            if expect is not None and expect != revision:
                return None
            db.execute(
                "INSERT OR REPLACE INTO records (key, revision, value, expires) VALUES (?, ?, ?, ?)",
                (key, revision + 1, value, now + ttl),
            )
            if random.randrange(PURGE_ONE_IN) == 0:
                db.execute("DELETE FROM records WHERE expires <= ?", (now,))
                db.execute("DELETE FROM members WHERE expires <= ?", (now,))
            return revision + 1

        return self._run(work, write=True)

    def join(self, group: str, member: str, ttl: float, most: int | None = None) -> bool:
        now = self.clock()

        def work(db):
            db.execute("DELETE FROM members WHERE grp = ? AND expires <= ?", (group, now))
            if most is not None:
                there = db.execute("SELECT 1 FROM members WHERE grp = ? AND member = ?", (group, member)).fetchone()
                (live,) = db.execute("SELECT COUNT(*) FROM members WHERE grp = ?", (group,)).fetchone()
                if not there and live >= most:
                    return False
            db.execute(
                "INSERT OR REPLACE INTO members (grp, member, expires) VALUES (?, ?, ?)", (group, member, now + ttl)
            )
            return True

        return bool(self._run(work, write=True))

    def count(self, group: str) -> int:
        now = self.clock()

        def work(db):
            return db.execute("SELECT COUNT(*) FROM members WHERE grp = ? AND expires > ?", (group, now)).fetchone()[0]

        return int(self._run(work, write=False))

    def leave(self, group: str, member: str) -> None:
        self._run(lambda db: db.execute("DELETE FROM members WHERE grp = ? AND member = ?", (group, member)), True)

    def check(self) -> None:
        self._run(lambda db: db.execute("SELECT 1").fetchone(), write=False)
