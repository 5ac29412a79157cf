"""Rooms: a presenter's view, shared through a store, that any number of screens follow.

A presenter opens a room and gets a `Room`: a short code to project, and a secret that only the
presenter's session holds. Whoever has the secret can `publish` the view; whoever has the code can
`read` it and `follow` (a heartbeat, so the presenter sees how many screens follow). The store
keeps the secret's SHA-256 only: a copy of the store does not give the right to drive. The secret
is 192 random bits, so a fast hash is enough (nobody can try 2**192 guesses).

Every bound (see `attnviz.app.rooms.settings.Limits`) is checked here, in the store, so it holds
across replicas: rooms open at once, rooms opened per minute, followers per room, writes per second
per room (a faster presenter is coalesced: the latest view is written when the interval has passed)
and the size and shape of the shared view (`check_state`).

A coalesced change is written by a timer, after the presenter's page has gone on: a write that fails
(the store does not answer) is tried again, at growing intervals, until it lands or the room is
gone, and `unwritten` tells the presenter's page meanwhile. Each change carries the time it was made
(the store's clock, the same for every replica), so that of two replicas' coalesced changes the
later one stays, whichever timer writes last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import math
import random
import re
import secrets
import threading
import time
import weakref
from collections.abc import Callable

from attnviz.app.rooms.settings import ENDED_KEPT_S, FOLLOW_WINDOW_S, MOST_STATE_KB, Limits
from attnviz.app.rooms.store import Store, StoreError
from attnviz.errors import InputError, describe

log = logging.getLogger(__name__)

ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"  # no 0/O, no 1/I: a code read off a projector is typed right
CODE_LENGTH = 6  # 32**6, about a billion codes
CODE = re.compile(f"[{ALPHABET}]{{{CODE_LENGTH}}}")
EXAMPLE_CODE = "K7QX2M"
STATE_KEYS = 64  # keys in a room's state
STATE_KEY = re.compile(r"[a-z][a-z0-9_]{0,31}")  # a key: like a URL parameter of the app
LIST_ITEMS = 256  # items in one list value (words chosen, a pointed cell)
LARGEST_INT = 2**53  # JSON numbers beyond lose digits in a browser
FOLLOWER_CHARS = 128  # a follower's session id
DIGEST = re.compile(r"[0-9a-f]{64}")  # a record's secret: the SHA-256 of the presenter's, in hex (`_hash`)
MOST_STATE_BYTES = MOST_STATE_KB * 1024  # a stored view at most: the largest ATTNVIZ_ROOM_STATE_KB allows
# A stored record at most, in characters: its view as JSON writes each 4 bytes of UTF-8 as 12 characters (\u escapes,
# a surrogate pair), three times the view's size, and its other fields are well under 4 KB.
MOST_RECORD_CHARS = 3 * MOST_STATE_BYTES + 4096
# The latest time a record may hold (about the year 2242): 1e300 had overflowed a coalesced change's timer
# (its room's changes never written again) and Redis's expiry in milliseconds.
LAST_TIME = 2.0**33
STORE_DOWN_SAID_S = 60.0  # a store that does not answer is logged at most once a minute per process
OPEN_TRIES = 8  # fresh codes tried when one is taken (with a billion codes, twice is already rare)
WRITE_TRIES = 24  # compare-and-set attempts when other writers keep getting in first
# Between two attempts a writer waits a random time, up to 1, 2, 4, ... ms (at most BACKOFF_MAX_S):
# without it two busy writers fall into step (each read made just before the other's write lands).
# Two processes writing 150 changes each as fast as they can, with three busy loops beside them on a
# 2-core AMD EPYC with AVX2 only: of 4,500 changes, 431 took 2 tries, 74 took 3, 14 took 4, 4 took 5 and
# 1 took 6, each try about a fifth as likely as the one before. Yet in a loaded CI run one change lost
# 8 races in a row (a process descheduled between its read and its write loses that try, however long
# it waited before), so a writer now tries 24 times. The waits add up to 1.2 s at most, and only under
# contention.
BACKOFF_S = 0.001
BACKOFF_MAX_S = 0.064
# A coalesced change whose write failed is tried again after 0.25 s, then 0.5, 1, 2, 4, 8, 8, ... s: a blip of
# the store costs the class a quarter of a second, a store that is down costs one write per room every 8 s.
RETRY_S = 0.25
RETRY_MAX_S = 8.0
# RoomError reasons after which a coalesced change is dropped: its room is gone, or it can never be written.
DROPPED = ("code", "unknown", "ended", "expired", "secret", "state")
_ANYONE = object()  # `Rooms._live` without a secret: a follower's read
UNAVAILABLE = "Rooms are not available right now: the server's room store does not answer. Try again in a moment."
UNWRITTEN = (
    "Your latest change has not reached the class yet: the server's room store did not take it. It is sent "
    "again every few seconds; the class keeps the view before meanwhile."
)


def _back_off(attempt: int) -> None:
    """Before compare-and-set attempt ``attempt`` (from 0): nothing, then a random wait (see BACKOFF_S)."""
    if attempt:
        time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (attempt - 1))))


class RoomError(InputError):
    """A room that cannot be opened, read, followed or driven; its message is one line for the visitor.

    ``reason`` says which, for a page that acts on it: "code" (malformed), "unknown", "ended"
    (closed by its presenter), "expired" (its time limit), "secret" (not the presenter's), "full"
    (followers), "limit" (rooms open, or opened per minute), "state" (a view that cannot be
    shared), "unavailable" (the store does not answer: try again), "unreadable" (the store holds a record
    that is not a room's: it will not mend) or "other".
    """

    def __init__(self, message: str, public: str | None = None, reason: str = "other"):
        super().__init__(message, public)
        self.reason = reason

    def __reduce__(self):
        return type(self), (str(self), self.public, self.reason)


@dataclasses.dataclass(frozen=True)
class Room:
    """What the presenter gets on opening a room: the code to show, the secret to keep (never to show)."""

    code: str
    secret: str = dataclasses.field(repr=False)  # repr leaves it out: a log line never holds it


@dataclasses.dataclass
class _Change:
    """A presenter's change coalesced and not yet written (`Rooms._coalesce`), held by the replica that got it."""

    secret: str = dataclasses.field(repr=False)
    state: dict
    made: float  # the store's clock when the presenter made it: the later of two replicas' changes stays
    failures: int = 0  # its writes that failed, in a row: the next one waits longer (RETRY_S)
    since: float = 0.0  # time.monotonic() of the first failure: tried again for a room's lifetime at most


@dataclasses.dataclass(frozen=True)
class RoomView:
    """A room as a follower sees it: the presenter's latest view and how many screens follow."""

    code: str
    version: int  # counts up on every change the presenter publishes: a follower redraws when it moves
    state: dict  # the presenter's view: link-style values (`check_state`)
    followers: int  # screens that sent a heartbeat in the last FOLLOW_WINDOW_S seconds
    ended: bool  # always False from `read` (an ended room raises); True only where a caller builds one
    updated: float  # when the view last changed (seconds since the epoch)


def normal_code(code: object) -> str:
    """``code`` as the store knows it (upper case, spaces and dashes left out); `RoomError` when it is no code."""
    if isinstance(code, str):
        shown = code.strip().upper().replace(" ", "").replace("-", "")
        if CODE.fullmatch(shown):
            return shown
    return _refuse(
        f"{describe(code)} is not a room code: a code is {CODE_LENGTH} letters and digits such as {EXAMPLE_CODE} "
        "(it never holds 0, O, 1 or I).",
        "code",
    )


def check_state(state: object, most_bytes: int) -> str:
    """``state`` as compact JSON (keys sorted); `RoomError` when it is not a view a room can share.

    A state is an object of at most `STATE_KEYS` keys, each like a URL parameter (`STATE_KEY`);
    each value a string, a whole number of at most 2**53, a finite number, true, false, null, or a
    list of at most `LIST_ITEMS` of those; the whole JSON at most ``most_bytes`` bytes (UTF-8).
    """
    if not isinstance(state, dict):
        _refuse(f"A room's view must be an object of named values, not {describe(state)}.", "state")
    if len(state) > STATE_KEYS:
        _refuse(f"A room's view holds at most {STATE_KEYS} values; this one has {len(state):,}.", "state")
    for key, value in state.items():
        if not isinstance(key, str) or not STATE_KEY.fullmatch(key):
            _refuse(
                f"{describe(key)} cannot name a value of a room's view (lower-case letters, digits and _).", "state"
            )
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) > LIST_ITEMS:
            _refuse(
                f"The room's value {key!r} is a list of {len(value):,} items; at most {LIST_ITEMS} are shared.", "state"
            )
        for item in items:
            if not _plain(item):
                _refuse(f"The room's value {key!r} cannot be shared: {describe(item)} is not a plain value.", "state")
    try:
        text = _text(state)
        size = len(text.encode("utf-8"))
    except (ValueError, UnicodeEncodeError):
        _refuse("The room's view holds text that is not valid Unicode.", "state")
    if size > most_bytes:
        _refuse(
            f"The room's view is {size / 1024:,.1f} KB; this server shares at most {most_bytes / 1024:,.0f} KB "
            "(ATTNVIZ_ROOM_STATE_KB): use a shorter text.",
            "state",
        )
    return text


def _text(state: dict) -> str:
    """``state`` as the rooms compare and store it: compact JSON, keys sorted."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _plain(value: object) -> bool:
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return abs(value) <= LARGEST_INT
    return isinstance(value, float) and math.isfinite(value)


def _refuse(message: str, reason: str):
    raise RoomError(message, reason=reason)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class Rooms:
    """The room logic over a store: `open_room`, `publish`, `read`, `follow`, `end`, `store_status`.

    ``store`` and ``limits`` are called on every operation, so the operator's configuration is
    read where it is used; the store's clock is the rooms' clock.
    """

    def __init__(self, store: Callable[[], Store], limits: Callable[[], Limits] = Limits.from_environment):
        self._store = store
        self._limits = limits
        self._pending: dict[str, _Change] = {}  # code -> the change coalesced, not yet written
        self._timers: dict[str, threading.Timer] = {}
        # One writer at a time per room in this process; a room's lock lives while a call holds it, so a room
        # that expires, or that its presenter leaves without ending it, leaves nothing behind.
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._down_said = (-math.inf, 0, "")  # when the store's failure was last logged, failures since, its text

    def open_room(self, state: dict) -> Room:
        """A new room showing ``state``; `RoomError` when a bound of the operator's is reached."""
        limits = self._limits()
        text = check_state(state, limits.state_bytes)
        store = self._open_store()
        lifetime = limits.hours * 3600
        opening = secrets.token_hex(8)  # this attempt, counted among the minute's; let go if no room opens
        with self._unavailable():
            if not store.join("opened", opening, 60.0, most=limits.per_minute):
                _refuse(
                    f"{limits.per_minute} rooms were opened on this server in the last minute, the most it allows "
                    "(ATTNVIZ_ROOMS_PER_MINUTE): try again in a minute.",
                    "limit",
                )
            code = None  # the code counted among the open rooms, while its record is not written
            try:
                for _ in range(OPEN_TRIES):
                    code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))
                    if store.get(_key(code)) is not None:  # taken (a live or recently ended room): draw another
                        code = None  # before joining: a live room's "open" entry had been renewed, then taken out
                        continue
                    if not store.join("open", code, lifetime, most=limits.rooms_open):
                        code = None
                        store.leave("opened", opening)  # refused: no room was opened this minute by it
                        _refuse(
                            f"This server already has {limits.rooms_open} rooms open, the most it allows "
                            "(ATTNVIZ_ROOMS_OPEN): end a room that is over, or try again later.",
                            "limit",
                        )
                    secret = secrets.token_urlsafe(24)
                    now = store.clock()
                    record = {
                        "secret": _hash(secret),
                        "state": json.loads(text),
                        "created": now,
                        "updated": now,
                        "changed": now,
                        "expires": now + lifetime,
                        "ended": False,
                    }
                    if store.put(_key(code), json.dumps(record), lifetime + ENDED_KEPT_S, expect=0) is not None:
                        log.info("room %s opened, for %.1f hours", code, limits.hours)
                        return Room(code, secret)
                    store.leave("open", code)  # taken since it was looked up (another replica's room): draw another
                    code = None
                store.leave("opened", opening)
            except StoreError:
                # No room opened: it must not count as open for its lifetime, nor this minute (best effort: the
                # store has just failed; the minute's count goes by itself).
                with contextlib.suppress(StoreError):
                    if code is not None:
                        store.leave("open", code)
                    store.leave("opened", opening)
                raise
        raise RoomError("No free room code was found; try again.")

    def read(self, code: str) -> RoomView:
        """The room's latest view; `RoomError` for a malformed, unknown, ended or expired code."""
        code = normal_code(code)
        store = self._open_store()
        with self._unavailable():
            version, record = self._live(store, code)
            followers = store.count(_followers(code))
        return RoomView(code, version, record["state"], followers, False, float(record["updated"]))

    def follow(self, code: str, follower: str) -> None:
        """Count ``follower`` (an opaque session id) as following the room for the next seconds."""
        code = normal_code(code)
        if not isinstance(follower, str) or not 0 < len(follower) <= FOLLOWER_CHARS:
            _refuse(
                f"A follower is named by a session id of 1 to {FOLLOWER_CHARS} characters, not {describe(follower)}.",
                "other",
            )
        limits = self._limits()
        store = self._open_store()
        with self._unavailable():
            self._live(store, code)
            member = hashlib.sha256(follower.encode("utf-8", "surrogatepass")).hexdigest()[:32]
            if not store.join(_followers(code), member, FOLLOW_WINDOW_S, most=limits.followers):
                _refuse(
                    f"Room {code} is full: {limits.followers} screens follow it, the most this server allows "
                    "(ATTNVIZ_ROOM_FOLLOWERS).",
                    "full",
                )

    def publish(self, code: str, secret: str, state: dict) -> int:
        """The room's version once ``state`` is its view; `RoomError` on a wrong secret, an ended or unknown room.

        A change that comes sooner than 1 / ``ATTNVIZ_ROOM_PUBLISHES_PER_S`` seconds after the last
        one is coalesced: the version returned is the one stored now, and the latest state
        is written (a new version) once the interval has passed.
        """
        code = normal_code(code)
        text = check_state(state, self._limits().state_bytes)
        with self._room_lock(code):
            change = None
            try:
                with self._unavailable():
                    store = self._store()
                    change = _Change(secret, json.loads(text), store.clock())
                    return self._write(store, code, change)
            except RoomError as e:
                if e.reason == "unavailable" and change is not None:
                    # kept and written once the store answers, in place of any older change held back: the class
                    # had been left on that older one, and this one was never tried again
                    self._try_again(code, change, e)
                raise

    def unwritten(self, code: str) -> str | None:
        """None unless a change of the presenter's to room ``code``, coalesced in this process, failed to be written
        and waits to be tried again; then one line for the presenter's page."""
        with self._lock:
            change = self._pending.get(code)
        return UNWRITTEN if change is not None and change.failures else None

    def resume(self, code: str, secret: str) -> Room:
        """The presenter's `Room` again, for a new session of the presenter (a reload, a restarted replica).

        Nothing is written: the room must be live and ``secret`` its presenter's; `RoomError` otherwise,
        as `publish` says it.
        """
        code = normal_code(code)
        store = self._open_store()
        with self._unavailable():
            self._live(store, code, secret)
        return Room(code, secret)

    def end(self, code: str, secret: str) -> None:
        """End the room: its followers are told it has ended; `RoomError` on a wrong secret or unknown room."""
        code = normal_code(code)
        store = self._open_store()
        with self._room_lock(code), self._unavailable():
            for attempt in range(WRITE_TRIES):
                _back_off(attempt)
                version, record = self._fetch(store, code)
                _check_secret(code, record, secret)
                if record["ended"]:
                    return
                record.update(ended=True, state={}, updated=store.clock())
                if store.put(_key(code), json.dumps(record), ENDED_KEPT_S, expect=version) is not None:
                    break
            else:
                raise RoomError(f"Room {code} is changing too fast to end; try again.")
            store.leave("open", code)
        with self._lock:
            self._pending.pop(code, None)
            timer = self._timers.pop(code, None)
        if timer is not None:
            timer.cancel()
        log.info("room %s ended by its presenter", code)

    def store_status(self) -> str | None:
        """None when the rooms' store answers; else one line saying rooms are unavailable (the cause is logged)."""
        try:
            self._store().check()
        except StoreError as e:
            self._store_down(e)
            return UNAVAILABLE
        return None

    @contextlib.contextmanager
    def _unavailable(self):
        """A `StoreError` inside the block becomes a `RoomError` with one line for the visitor (the cause is logged)."""
        try:
            yield
        except StoreError as e:
            self._store_down(e)
            raise RoomError(UNAVAILABLE, reason="unavailable") from e

    def _store_down(self, error: StoreError) -> None:
        """Log that the store does not answer: a failure of another kind at once, the same one at most once every
        `STORE_DOWN_SAID_S` seconds with the count of failures between. Every follower's poll fails while the
        store is down, twice a second each."""
        now, text = time.monotonic(), str(error)
        with self._lock:
            said, since, last = self._down_said
            if text == last and now - said < STORE_DOWN_SAID_S:
                self._down_said = (said, since + 1, last)
                return
            self._down_said = (now, 0, text)
        more = f" ({since:,} more failures since the last line)" if since and text == last else ""
        log.warning("the rooms' store does not answer: %s%s", error, more)

    def _open_store(self) -> Store:
        with self._unavailable():
            return self._store()

    def _fetch(self, store: Store, code: str) -> tuple[int, dict]:
        found = store.get(_key(code))
        if found is None:
            raise _unknown(code, self._limits())
        return found[0], _record(code, found[1])

    def _live(self, store: Store, code: str, secret: object = _ANYONE) -> tuple[int, dict]:
        """The room's version and record while it is live; with ``secret``, only for its presenter."""
        version, record = self._fetch(store, code)
        if secret is not _ANYONE:
            _check_secret(code, record, secret)  # first: a wrong secret learns nothing more of the room
        if record["ended"]:
            _refuse(f"Room {code} has ended: the presenter closed it.", "ended")
        if store.clock() >= record["expires"]:
            _refuse(f"Room {code} has ended: it reached the time limit this server sets for rooms.", "expired")
        return version, record

    def _write(self, store: Store, code: str, change: _Change, delayed: bool = False) -> int:
        """The room's version once ``change`` is its view, or once it is coalesced (`_coalesce`).

        ``delayed``: a coalesced change that its timer writes, dropped when the view stored was made after it
        (by another replica, whose coalesced change was written first). A change written at once is the latest.
        """
        for attempt in range(WRITE_TRIES):
            _back_off(attempt)
            version, record = self._live(store, code, change.secret)
            now = store.clock()
            # compared as JSON, where 1, 1.0 and true differ (in Python they are equal, and a change from one to
            # another had been taken for none: the followers kept the old value). A view stamped ahead of this
            # clock (another machine's, a hand edit) is not taken for a later one: it had dropped every coalesced
            # change of the presenter's, who was told they were published.
            if delayed and change.made < max(_made(record), _kept(store, code)) <= now:
                self._forget_pending(code)
                return version
            if _text(record["state"]) == _text(change.state):
                self._forget_pending(code)
                if not delayed and _made(record) < change.made:
                    # the view stored is the presenter's latest again: said beside it (its version stays, for the
                    # followers), or an older change another replica holds back would be written over it
                    ttl = float(record["expires"]) + ENDED_KEPT_S - now
                    store.put(_kept_key(code), repr(change.made), ttl)
                return version
            interval = 1 / self._limits().publishes_per_s
            updated = float(record["updated"])
            # at most the interval: a last write stamped ahead of this clock holds no change longer; and a change
            # that has waited that interval is written (coalesced again on every try, it had waited for the stamp)
            wait = 0.0 if delayed and updated > now else min(updated + interval - now, interval)
            if wait > 0:
                self._coalesce(code, change, wait)
                return version
            record.update(state=change.state, updated=now, changed=change.made)
            ttl = float(record["expires"]) + ENDED_KEPT_S - now
            written = store.put(_key(code), json.dumps(record), ttl, expect=version)
            if written is not None:
                self._forget_pending(code)
                return written
        raise RoomError(f"Room {code} is changing too fast to publish to; try again.")

    def _coalesce(self, code: str, change: _Change, wait: float) -> None:
        with self._lock:
            held = self._pending.get(code)
            if held is not None and held.failures:  # the new change takes the place of one that failed
                change.failures, change.since = held.failures, held.since
            self._pending[code] = change
            if code in self._timers:
                return
            timer = threading.Timer(wait, self._flush, args=(code,))
            timer.daemon = True
            self._timers[code] = timer
        timer.start()

    def _flush(self, code: str) -> None:
        """The timer's work: write the room's coalesced change; if the store fails, keep it and try again later."""
        with self._room_lock(code):
            with self._lock:
                self._timers.pop(code, None)
                change = self._pending.pop(code, None)
            if change is None:
                return
            try:
                with self._unavailable():
                    self._write(self._store(), code, change, delayed=True)
            except RoomError as e:
                if e.reason in DROPPED:
                    log.warning("room %s: a coalesced change was not written: %s", code, e)
                else:
                    self._try_again(code, change, e)
                return
            with self._lock:
                written = code not in self._pending  # else coalesced again: another replica had just written
            if written and change.failures:
                log.info("room %s: a coalesced change was written after %d failed writes", code, change.failures)

    def _try_again(self, code: str, change: _Change, error: RoomError) -> None:
        """Keep ``change`` pending after a failed write, and write it again after a wait that grows (RETRY_S)."""
        now = time.monotonic()
        change.failures += 1
        change.since = change.since or now
        if now - change.since > self._limits().hours * 3600:  # its room has ended by now, whatever the store says
            log.error("room %s: a coalesced change was given up after %d failed writes", code, change.failures)
            return
        wait = min(RETRY_MAX_S, RETRY_S * 2 ** (change.failures - 1))
        if change.failures == 1:  # said once: a store that is down fails every room's writes every few seconds
            log.warning("room %s: a coalesced change was not written, tried again until it is: %s", code, error)
        self._coalesce(code, change, wait)

    def _forget_pending(self, code: str) -> None:
        with self._lock:
            self._pending.pop(code, None)

    def _room_lock(self, code: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(code, threading.Lock())


def _key(code: str) -> str:
    return "room:" + code


def _kept_key(code: str) -> str:
    return "kept:" + code


def _kept(store: Store, code: str) -> float:
    """When the presenter last published the view the room already showed (the store's clock), -inf if never: a
    change held back before it is older than the view, though the room's record was not written."""
    found = store.get(_kept_key(code))
    try:
        return float(found[1]) if found is not None else -math.inf
    except ValueError:  # not written by this code: no such time
        return -math.inf


def _made(record: dict) -> float:
    """When the presenter made the view ``record`` holds (the store's clock); -inf for a record that does not say
    (written by an earlier attnviz): any change is newer."""
    return float(record["changed"]) if "changed" in record else -math.inf


def _followers(code: str) -> str:
    return "followers:" + code


def _record(code: str, text: str) -> dict:
    """The room's record as the store holds it; `RoomError` for one this code could not have written (another
    program's, a hand edit): its size, its times, its secret's digest and its view are checked as they were
    written, so that no page shows, waits on or compares what no presenter made."""
    try:
        record = json.loads(text) if len(text) <= MOST_RECORD_CHARS else None
        if (
            isinstance(record, dict)
            and all(_time(record.get(name)) for name in ("updated", "expires"))
            and all(_time(record[name]) for name in ("created", "changed") if name in record)  # an earlier attnviz's
            and isinstance(record.get("secret"), str)
            and DIGEST.fullmatch(record["secret"])
            and isinstance(record.get("ended"), bool)
        ):
            check_state(record.get("state"), MOST_STATE_BYTES)
            return record
    except (ValueError, KeyError, TypeError, RecursionError, RoomError):  # RecursionError: JSON nested too deep
        pass
    log.error("room %s: the store holds a record that is not a room's", code)
    raise RoomError(
        f"Room {code} cannot be read on this server; the presenter can open a new one.", reason="unreadable"
    )


def _time(value: object) -> bool:
    """A time as the rooms write it: seconds since 1970 by the store's clock, up to `LAST_TIME`."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= LAST_TIME


def _check_secret(code: str, record: dict, secret: object) -> None:
    given = _hash(secret) if isinstance(secret, str) else ""
    if not hmac.compare_digest(given, record["secret"]):
        _refuse(f"Only the presenter who opened room {code} can change it.", "secret")


def _unknown(code: str, limits: Limits) -> RoomError:
    return RoomError(
        f"There is no room {code} on this server: check the code with the presenter "
        f"(a room ends when its presenter closes it, or after {limits.hours:g} hours).",
        reason="unknown",
    )
