"""The rooms' store on one machine: a SQLite file in WAL mode that every replica opens.

Several server processes (``deploy/serve.sh``'s replicas) open the same file. WAL mode lets readers
go on while one process writes; ``busy_timeout`` makes a writer wait for another's short
transaction instead of failing; each call is one short transaction (``BEGIN IMMEDIATE`` for a
write, so that a compare-and-set reads and writes under the same lock). A process killed half-way
loses nothing that was committed: the file, not a process, holds the rooms.

Within a process, each call borrows a connection of its own (`SQLiteStore._borrow`) for its
transaction: a writer that waits for another process's lock waits alone, and the replica's other
calls go on. One connection shared under a lock had made every room call of a replica queue behind
such a wait, two seconds each, reads too.
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
IDLE_KEPT = 8  # connections a process keeps open between calls (more are opened while more calls run at once)

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
        self._lock = threading.Lock()  # guards the idle connections only, never a transaction
        self._idle: list[sqlite3.Connection] = []  # connections no call is using, of process _pid
        self._pid = os.getpid()

    def _connect(self) -> sqlite3.Connection:
        """A new connection to the file (made, with its tables, if there is none)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # in WAL mode: durable against a killed process
            db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the rooms' file {self.path}: {e}") from e
        return db

    def _borrow(self) -> sqlite3.Connection:
        """A connection for one call's transaction: an idle one, or a new one (opened outside the lock)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child opens its own connections
                self._idle, self._pid = [], os.getpid()
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give_back(self, db: sqlite3.Connection) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < IDLE_KEPT:
                self._idle.append(db)
                return
        db.close()

    def _run(self, work: Callable[[sqlite3.Connection], object], write: bool):
        db = self._borrow()
        try:
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = work(db)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):  # a later call opens the file afresh (it may have been replaced)
                db.close()
            raise StoreError(f"the rooms' file {self.path} cannot be used: {e}") from e
        except BaseException:
            self._give_back(db)  # rolled back: the connection is sound
            raise
        self._give_back(db)
        return result

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
