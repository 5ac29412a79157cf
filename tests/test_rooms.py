"""Rooms: the store contract and the room logic, run against every store (memory, SQLite, a real Redis).

Each store gets the same tests. Time is a clock the test moves (the stores and the room logic
read it), so a room's three hours or a follower's ten seconds pass at once; only the Redis
record's own expiry is real time, and its test waits a fraction of a second for it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import signal
import sqlite3
import threading
import time
import types

import pytest
from rooms_servers import RedisServer

from attnviz.app import rooms
from attnviz.app.rooms import FOLLOW_WINDOW_S, Limits, RoomError, Rooms, settings, sqlite_store
from attnviz.app.rooms import room as room_module
from attnviz.app.rooms.redis_store import RedisStore
from attnviz.app.rooms.room import ALPHABET, CODE_LENGTH, LIST_ITEMS, STATE_KEYS, UNAVAILABLE, UNWRITTEN
from attnviz.app.rooms.settings import ENDED_KEPT_S
from attnviz.app.rooms.sqlite_store import SQLiteStore
from attnviz.app.rooms.store import MemoryStore, StoreError

STATE = {"page": "walkthrough", "model": "tiny", "text": "The cat sat.", "layer": 1, "head": 2, "cell": [3, 1]}


class Clock:
    """A clock the test moves: ``clock()`` is now, ``advance(s)`` moves it on."""

    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request, tmp_path):
    clock = Clock()
    if request.param == "memory":
        return MemoryStore(clock)
    if request.param == "sqlite":
        return SQLiteStore(tmp_path / "rooms", clock)
    server = request.getfixturevalue("redis_server")
    made = RedisStore(server.url, clock)
    made._redis.flushdb()  # each test starts from an empty store
    return made


def make_rooms(store, **limits) -> Rooms:
    """Rooms over ``store`` with the default limits, some replaced."""
    return Rooms(lambda: store, lambda: Limits(**limits))


def raises(reason: str, call, *args) -> RoomError:
    """The RoomError ``call(*args)`` raises; the test fails unless its reason is ``reason`` and it is one line."""
    with pytest.raises(RoomError) as caught:
        call(*args)
    error = caught.value
    assert error.reason == reason, str(error)
    assert "\n" not in str(error) and len(str(error)) < 300 and str(error) == error.public
    return error


def eventually(condition, seconds: float = 5.0) -> None:
    """Wait until ``condition()`` holds (a timer's work, in another thread); the test fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.01)


class Failing:
    """``store`` whose ``methods`` fail while ``fail`` counts calls to fail (a Redis that times out, a SQLite file
    busy for more than 2 s); ``failed`` counts the calls that failed."""

    def __init__(self, store, *methods: str):
        self._store, self._methods = store, methods
        self.clock = store.clock
        self.fail, self.failed = 0, 0

    def __getattr__(self, name: str):
        found = getattr(self._store, name)
        if name not in self._methods:
            return found

        def call(*args, **kwargs):
            if self.fail > 0:
                self.fail -= 1
                self.failed += 1
                raise StoreError("the rooms' Redis does not answer: Timeout reading from socket")
            return found(*args, **kwargs)

        return call


def flush_now(rooms_: Rooms, code: str) -> None:
    """Do now what the timers of ``rooms_`` do for ``code``'s coalesced change, until none is pending: before each
    write the clock moves past the writes' interval (the timers are cancelled, the tests' intervals are long)."""
    for _ in range(3):
        if code not in rooms_._timers:
            return
        rooms_._timers[code].cancel()
        rooms_._store().clock.advance(60)
        rooms_._flush(code)
    pytest.fail(f"room {code}'s change is still pending")


# The store contract


def test_a_record_is_written_on_condition(store):
    assert store.get("k") is None
    assert store.put("k", "one", 60, expect=0) == 1
    assert store.put("k", "taken", 60, expect=0) is None  # only where there is none
    assert store.put("k", "two", 60, expect=1) == 2
    assert store.put("k", "stale", 60, expect=1) is None  # another writer got in first
    assert store.get("k") == (2, "two")
    assert store.put("k", "three", 60) == 3  # no condition
    assert store.get("k") == (3, "three")


def test_a_record_expires(store):
    store.put("short", "v", 0.2)
    store.put("long", "v", 60)
    store.clock.advance(0.3)
    time.sleep(0.3)  # Redis expires a key by its own clock
    assert store.get("short") is None
    assert store.get("long") == (1, "v")
    assert store.put("short", "again", 60, expect=0) == 1  # an expired record is no record


def test_a_group_counts_live_members_and_stops_at_its_bound(store):
    assert store.count("g") == 0
    assert store.join("g", "a", 10) and store.join("g", "b", 10)
    assert store.join("g", "a", 10)  # a heartbeat of a member is no new member
    assert store.count("g") == 2
    assert not store.join("g", "c", 10, most=2)
    assert store.count("g") == 2
    assert store.join("g", "a", 10, most=2)  # a member already in renews, full or not
    store.leave("g", "a")
    assert store.count("g") == 1
    assert store.join("g", "c", 10, most=2)
    assert store.count("other") == 0


def test_group_members_expire(store):
    store.join("g", "old", 5)
    store.clock.advance(3)
    store.join("g", "new", 5)
    store.clock.advance(3)
    assert store.count("g") == 1  # "old" went after 5 s, "new" has 2 s left
    assert store.join("g", "third", 5, most=2)


def test_a_store_that_answers_checks_out(store):
    assert store.check() is None


# The room logic, on every store


def test_a_follower_reads_what_the_presenter_publishes(store):
    rooms_ = make_rooms(store)
    room = rooms_.open_room(STATE)
    assert len(room.code) == CODE_LENGTH and set(room.code) <= set(ALPHABET)
    assert room.secret not in repr(room)
    first = rooms_.read(room.code)
    assert first.state == STATE and first.code == room.code and first.followers == 0 and not first.ended
    store.clock.advance(1)
    changed = {**STATE, "layer": 2, "cell": [4, 0]}
    version = rooms_.publish(room.code, room.secret, changed)
    assert version > first.version
    view = rooms_.read(room.code)
    assert (view.version, view.state, view.updated) == (version, changed, store.clock())
    store.clock.advance(1)
    assert rooms_.publish(room.code, room.secret, changed) == version  # the same view is no change


def test_a_presenter_who_loses_every_race_is_told_to_try_again_in_one_line(store, monkeypatch):
    """Another replica's write lands between each read and write of the presenter's: after WRITE_TRIES tries,
    with random, doubling waits between them, the presenter is told to try again and the other's view stands;
    ending the room is refused the same way."""
    rooms_ = make_rooms(store, publishes_per_s=math.inf)  # every change written at once, none coalesced
    room = rooms_.open_room(STATE)
    put, theirs = store.put, []

    def beaten(key, value, ttl, expect=None):
        record = {**json.loads(value), "ended": False, "state": {**STATE, "layer": len(theirs)}}
        theirs.append(put(key, json.dumps(record), ttl))
        return put(key, value, ttl, expect=expect)

    slept = []
    monkeypatch.setattr(store, "put", beaten)
    monkeypatch.setattr(room_module, "time", types.SimpleNamespace(sleep=slept.append, monotonic=time.monotonic))
    error = raises("other", rooms_.publish, room.code, room.secret, {**STATE, "layer": 99})
    assert str(error) == f"Room {room.code} is changing too fast to publish to; try again."
    assert len(theirs) == room_module.WRITE_TRIES
    view = rooms_.read(room.code)
    assert view.version == theirs[-1] and view.state == {**STATE, "layer": room_module.WRITE_TRIES - 1}
    # no wait before the first try, then at most 1, 2, 4, ... ms, never more than BACKOFF_MAX_S
    bounds = [min(room_module.BACKOFF_MAX_S, room_module.BACKOFF_S * 2**i) for i in range(len(slept))]
    assert len(slept) == room_module.WRITE_TRIES - 1
    assert all(0 <= s <= bound for s, bound in zip(slept, bounds, strict=True))
    assert sum(bounds) < 1.25

    error = raises("other", rooms_.end, room.code, room.secret)
    assert str(error) == f"Room {room.code} is changing too fast to end; try again."
    assert not rooms_.read(room.code).ended


def test_a_code_is_read_however_it_is_typed(store):
    rooms_ = make_rooms(store)
    code = rooms_.open_room(STATE).code
    for typed in (code.lower(), f" {code[:3]}-{code[3:]} ", f"{code[:3]} {code[3:].lower()}"):
        assert rooms_.read(typed).code == code


def test_followers_are_counted_by_their_heartbeats(store):
    rooms_ = make_rooms(store)
    code = rooms_.open_room(STATE).code
    rooms_.follow(code, "session-a")
    rooms_.follow(code, "session-b")
    rooms_.follow(code, "session-a")
    assert rooms_.read(code).followers == 2
    store.clock.advance(FOLLOW_WINDOW_S - 1)
    rooms_.follow(code, "session-b")
    store.clock.advance(2)
    assert rooms_.read(code).followers == 1  # a has gone quiet, b's heartbeat is recent


def test_a_wrong_secret_changes_nothing(store):
    rooms_ = make_rooms(store)
    room = rooms_.open_room(STATE)
    other = rooms_.open_room({"page": "home"})
    store.clock.advance(1)
    before = rooms_.read(room.code)
    for secret in ("", "guess", other.secret, room.secret[:-1], room.secret + "x", None, 42, room.code):
        raises("secret", rooms_.publish, room.code, secret, {"page": "forged"})
        raises("secret", rooms_.end, room.code, secret)
    assert rooms_.read(room.code) == before
    raises("secret", rooms_.publish, room.code, "guess", {"page": "forged"})  # not coalesced: refused at once
    store.clock.advance(1)
    assert rooms_.read(room.code) == before


def test_the_presenter_resumes_a_room_with_its_secret_and_writes_nothing(store):
    """A new session of the presenter's tab (a reload, a restarted replica) gets its room back with the secret."""
    rooms_ = make_rooms(store)
    room = rooms_.open_room(STATE)
    before = store.get("room:" + room.code)
    again = make_rooms(store).resume(room.code.lower(), room.secret)  # another replica's Rooms
    assert (again.code, again.secret) == (room.code, room.secret)
    assert store.get("room:" + room.code) == before
    for secret in ("", "guess", room.secret[:-1], None, 42):
        raises("secret", rooms_.resume, room.code, secret)
    code = "K7QX2M" if room.code != "K7QX2M" else "K7QX2N"
    raises("unknown", rooms_.resume, code, room.secret)
    raises("code", rooms_.resume, "not a code", room.secret)
    rooms_.end(room.code, room.secret)
    raises("ended", rooms_.resume, room.code, room.secret)


def test_the_store_keeps_no_secret(store):
    rooms_ = make_rooms(store)
    room = rooms_.open_room(STATE)
    version, value = store.get("room:" + room.code)
    assert room.secret not in value and json.loads(value)["state"] == STATE
    if isinstance(store, SQLiteStore):
        for path in store.path.parent.iterdir():  # the file and its write-ahead log
            assert room.secret.encode() not in path.read_bytes()


@pytest.mark.parametrize("code", ["", "abc", "K7QX2", "K7QX2MM", "K7QX0M", "OOOOOO", "1IIIII", "K7Q;2M", 123, None])
def test_a_malformed_code_gets_one_line(store, code):
    rooms_ = make_rooms(store)
    error = raises("code", rooms_.read, code)
    assert "is not a room code" in str(error)
    raises("code", rooms_.follow, code, "session")
    raises("code", rooms_.publish, code, "secret", STATE)


def test_a_long_malformed_code_is_not_echoed(store):
    error = raises("code", make_rooms(store).read, "K" * 100_000)
    assert "a string of 100,000 characters" in str(error)


def test_an_unknown_code_gets_one_line(store):
    rooms_ = make_rooms(store)
    opened = rooms_.open_room(STATE).code
    code = "K7QX2M" if opened != "K7QX2M" else "K7QX2N"
    assert "There is no room" in str(raises("unknown", rooms_.read, code))
    raises("unknown", rooms_.follow, code, "session")
    raises("unknown", rooms_.publish, code, "secret", STATE)
    raises("unknown", rooms_.end, code, "secret")


def test_an_ended_room_says_so_to_everyone(store):
    rooms_ = make_rooms(store)
    room = rooms_.open_room(STATE)
    rooms_.follow(room.code, "session")
    rooms_.end(room.code, room.secret)
    rooms_.end(room.code, room.secret)  # twice: nothing more happens
    assert "the presenter closed it" in str(raises("ended", rooms_.read, room.code))
    raises("ended", rooms_.follow, room.code, "session")
    raises("ended", rooms_.publish, room.code, room.secret, STATE)
    store.clock.advance(ENDED_KEPT_S + 1)
    time.sleep(0.01)
    if not isinstance(store, RedisStore):  # Redis keeps the record for the real hour; the others by the clock
        raises("unknown", rooms_.read, room.code)


def test_a_room_expires_after_the_operators_hours(store):
    rooms_ = make_rooms(store, hours=0.5)
    room = rooms_.open_room(STATE)
    store.clock.advance(0.5 * 3600 - 1)
    rooms_.read(room.code)
    store.clock.advance(2)
    assert "time limit" in str(raises("expired", rooms_.read, room.code))
    raises("expired", rooms_.follow, room.code, "session")
    raises("expired", rooms_.publish, room.code, room.secret, {"page": "later"})


def test_rooms_open_at_once_are_bounded(store):
    rooms_ = make_rooms(store, rooms_open=2)
    first = rooms_.open_room(STATE)
    rooms_.open_room(STATE)
    assert "ATTNVIZ_ROOMS_OPEN" in str(raises("limit", rooms_.open_room, STATE))
    rooms_.end(first.code, first.secret)
    rooms_.open_room(STATE)
    raises("limit", rooms_.open_room, STATE)
    store.clock.advance(3 * 3600 + 1)  # rooms that expired are not open
    rooms_.open_room(STATE)


def test_room_creations_per_minute_are_bounded(store):
    rooms_ = make_rooms(store, per_minute=3)
    for _ in range(3):
        rooms_.open_room(STATE)
    assert "ATTNVIZ_ROOMS_PER_MINUTE" in str(raises("limit", rooms_.open_room, STATE))
    store.clock.advance(61)
    rooms_.open_room(STATE)


def test_an_open_refused_counts_for_nothing_per_minute(store):
    """A presenter refused because the server's rooms are all open had still used the minute's allowance."""
    rooms_ = make_rooms(store, rooms_open=1, per_minute=3)
    first = rooms_.open_room(STATE)
    for _ in range(2):
        raises("limit", rooms_.open_room, STATE)  # the open rooms' bound
    rooms_.end(first.code, first.secret)
    rooms_.open_room(STATE)  # the second opening of this minute, not the fourth


def test_a_store_error_while_opening_leaves_nothing_counted(store):
    """The store fails between counting a room and writing it: neither the open rooms nor the minute's count it
    (each such failure had been an open room for the room's whole lifetime, until none could open)."""
    failing = Failing(store, "put")
    rooms_ = make_rooms(failing, rooms_open=1, per_minute=1)
    failing.fail = 1
    raises("unavailable", rooms_.open_room, STATE)
    assert (store.count("open"), store.count("opened")) == (0, 0)
    rooms_.open_room(STATE)  # the one room this server allows, in the same minute


@pytest.mark.parametrize(
    "damage",
    [
        {"expires": "inf"},
        {"updated": None},
        {"expires": float("nan")},
        {"ended": "no"},
        {"updated": 10**400},  # math.isfinite raised OverflowError on it
        {"changed": 10**400},
        {"updated": 1e300},  # a coalesced change's timer died on it (timestamp out of range), its room stuck
        {"expires": 1e308},  # Redis's expiry in ms overflowed
        {"created": -1.0},
        {"secret": "é"},  # hmac.compare_digest raised TypeError on it
        {"secret": ""},
        {"state": {"BAD KEY": 1}},  # a view no presenter could have published, shown to every follower
        {"state": {"n": float("nan")}},
        {"state": {"big": 10**300}},
        {"state": {"t": "x" * (1024 * 1024 + 1)}},  # over the most any operator may allow
    ],
    ids=[
        "expires as text", "no update time", "expires NaN", "ended as text", "a huge whole update time",
        "a huge whole change time", "an update time far off", "an expiry far off", "created before 1970",
        "a secret not hex", "an empty secret", "a key no view has", "a NaN value", "a huge number", "a huge view",
    ],
)  # fmt: skip
def test_a_record_of_the_wrong_types_is_one_line(store, damage):
    """A record a person wrote into the store by hand: one line to every call, never a TypeError, an OverflowError
    or a view no presenter published in the page."""
    rooms_ = make_rooms(store, publishes_per_s=1e6)
    mine = rooms_.open_room(STATE)
    key = f"room:{mine.code}"
    revision, text = store.get(key)
    record = {**json.loads(text), **damage}
    store.put(key, json.dumps(record), 3600, expect=revision)
    raises("unreadable", rooms_.read, mine.code)
    raises("unreadable", rooms_.follow, mine.code, "session")
    raises("unreadable", rooms_.publish, mine.code, mine.secret, {"page": "next"})
    raises("unreadable", rooms_.resume, mine.code, mine.secret)
    raises("unreadable", rooms_.end, mine.code, mine.secret)
    assert not rooms_._timers, "no change waits on a record that is not a room's"


def test_a_record_nested_past_pythons_recursion_is_one_line(store):
    """JSON nested 100,000 deep: json.loads raised RecursionError through every call."""
    rooms_ = make_rooms(store)
    mine = rooms_.open_room(STATE)
    key = f"room:{mine.code}"
    revision, _ = store.get(key)
    store.put(key, "[" * 100_000, 3600, expect=revision)
    raises("unreadable", rooms_.read, mine.code)
    raises("unreadable", rooms_.publish, mine.code, mine.secret, STATE)


@pytest.mark.parametrize("grow", ["padded", "an extra value"])
def test_a_record_larger_than_any_room_writes_is_one_line(store, grow):
    """A record grown by hand past what any room's record can be: 4 MB of spaces inside its JSON, or a value of
    4 MB under a name no room writes. Both had been read as the room (parsed on every follower's poll, and the
    extra value written back on every change); they are a record that is not a room's."""
    rooms_ = make_rooms(store, publishes_per_s=1e6)
    mine = rooms_.open_room(STATE)
    key = f"room:{mine.code}"
    revision, text = store.get(key)
    junk = 4 * 1024 * 1024
    grown = text[:-1] + " " * junk + "}" if grow == "padded" else json.dumps({**json.loads(text), "junk": "x" * junk})
    store.put(key, grown, 3600, expect=revision)
    raises("unreadable", rooms_.read, mine.code)
    raises("unreadable", rooms_.publish, mine.code, mine.secret, {"page": "next"})


def test_the_largest_view_an_operator_allows_is_read_back(store):
    """The bound on a record's size leaves room for the largest view: 1024 KB of characters that JSON writes
    three times as long (each 4 bytes of UTF-8 is 12 characters as the record stores it)."""
    rooms_ = make_rooms(store, state_bytes=settings.MOST_STATE_KB * 1024)
    wide = "\U0001f600" * (settings.MOST_STATE_KB * 256 - 8)
    mine = rooms_.open_room({"text": wide})
    assert rooms_.read(mine.code).state == {"text": wide}


def test_a_change_of_a_values_type_alone_is_published(store):
    """1, 1.0 and true are equal in Python: a change from one to another was taken for no change, and the
    followers kept the old value though the presenter was told it was published."""
    rooms_ = make_rooms(store, publishes_per_s=1e6)
    room = rooms_.open_room({"x": 1})
    for value in (True, 1.0, -0.0, 0.0, [1], [True]):
        store.clock.advance(1)
        rooms_.publish(room.code, room.secret, {"x": value})
        shown = rooms_.read(room.code).state["x"]
        assert json.dumps(shown) == json.dumps(value), (value, shown)


def test_a_coalesced_change_waits_no_longer_than_the_interval(store):
    """A record whose last write is stamped ahead of this replica's clock (another machine's clock, or a hand
    edit): the change is coalesced for the interval at most, never for as long as the stamp is ahead."""
    rooms_ = make_rooms(store, publishes_per_s=10)
    room = rooms_.open_room(STATE)
    key = f"room:{room.code}"
    revision, text = store.get(key)
    store.put(key, json.dumps({**json.loads(text), "updated": store.clock() + 86_400}), 3600, expect=revision)
    rooms_.publish(room.code, room.secret, {"page": "next"})
    assert rooms_._timers[room.code].interval <= 0.1
    rooms_.end(room.code, room.secret)


@pytest.mark.parametrize("store", ["sqlite", "redis"], indirect=True)  # the stores a person can write into
@pytest.mark.parametrize("revision", ["abc", "-1", "0", "1000000000001", "9999999999999999999"])
def test_a_revision_that_is_no_number_is_one_line(store, revision):
    """Written by hand into a shared store: the rooms say they are not available, never a ValueError. A revision
    is 1 up to 10**12: -1 was read as a version, 0 as "no record", and 10**19 - 1 made Redis's next revision
    1e+19, after which the room could not be read at all."""
    rooms_ = make_rooms(store)
    mine = rooms_.open_room(STATE)
    if isinstance(store, SQLiteStore):
        store._connect().execute("UPDATE records SET revision = ? WHERE key = ?", (revision, f"room:{mine.code}"))
    else:
        store._redis.hset(f"attnviz:rooms:room:{mine.code}", "revision", revision)
    raises("unavailable", rooms_.read, mine.code)
    raises("unavailable", rooms_.publish, mine.code, mine.secret, {"page": "next"})


@pytest.mark.parametrize("store", ["redis"], indirect=True)  # the one store that holds bytes
def test_a_record_that_is_not_text_is_one_line(store):
    """Bytes that are no UTF-8 (another program on the same Redis database, a hand edit): a record that is not a
    room's, never a UnicodeDecodeError in the follower's page."""
    rooms_ = make_rooms(store)
    mine = rooms_.open_room(STATE)
    store._redis.hset(f"attnviz:rooms:room:{mine.code}", "value", b"\xff\xfe not UTF-8")
    assert "cannot be read" in str(raises("unreadable", rooms_.read, mine.code))
    raises("unreadable", rooms_.follow, mine.code, "session")
    raises("unreadable", rooms_.publish, mine.code, mine.secret, STATE)


def test_followers_per_room_are_bounded(store):
    rooms_ = make_rooms(store, followers=2)
    code = rooms_.open_room(STATE).code
    other = rooms_.open_room(STATE).code
    rooms_.follow(code, "a")
    rooms_.follow(code, "b")
    assert "is full" in str(raises("full", rooms_.follow, code, "c"))
    rooms_.follow(code, "a")  # those already following keep following
    rooms_.follow(other, "c")  # the bound is per room
    store.clock.advance(FOLLOW_WINDOW_S + 1)
    rooms_.follow(code, "c")  # a screen that went quiet leaves its place


def test_a_follower_is_an_opaque_bounded_id(store):
    rooms_ = make_rooms(store)
    code = rooms_.open_room(STATE).code
    for follower in ("", "x" * 129, None, 7):
        raises("other", rooms_.follow, code, follower)
    rooms_.follow(code, "x" * 128)


@pytest.mark.parametrize(
    "state, says",
    [
        ([1, 2], "must be an object"),
        ({f"k{i}": 1 for i in range(STATE_KEYS + 1)}, f"at most {STATE_KEYS} values"),
        ({"Page": "x"}, "cannot name a value"),
        ({"a-b": "x"}, "cannot name a value"),
        ({"x" * 33: 1}, "cannot name a value"),
        ({1: "x"}, "cannot name a value"),
        ({"cell": {"row": 1}}, "not a plain value"),
        ({"cell": [[1, 2]]}, "not a plain value"),
        ({"zoom": float("nan")}, "not a plain value"),
        ({"zoom": float("inf")}, "not a plain value"),
        ({"step": 2**60}, "not a plain value"),
        ({"words": list(range(LIST_ITEMS + 1))}, f"at most {LIST_ITEMS}"),
        ({"text": "\ud800"}, "not valid Unicode"),
        ({"text": "é" * 40_000}, "ATTNVIZ_ROOM_STATE_KB"),
    ],
)
def test_a_view_that_cannot_be_shared_gets_one_line(store, state, says):
    rooms_ = make_rooms(store)
    assert says in str(raises("state", rooms_.open_room, state))
    room = rooms_.open_room(STATE)
    store.clock.advance(1)
    assert says in str(raises("state", rooms_.publish, room.code, room.secret, state))
    assert rooms_.read(room.code).state == STATE


def test_the_view_size_is_the_operators(store):
    text = {"text": "x" * 10_000}
    raises("state", make_rooms(store, state_bytes=8 * 1024).open_room, text)
    make_rooms(store, state_bytes=16 * 1024).open_room(text)


def test_a_fast_presenter_is_coalesced_to_the_latest_view(store):
    rooms_ = make_rooms(store, publishes_per_s=10)
    room = rooms_.open_room(STATE)
    store.clock.advance(1)
    written = rooms_.publish(room.code, room.secret, {"page": "a"})
    # Within the same tenth of a second: nothing is written now, the version stays...
    assert rooms_.publish(room.code, room.secret, {"page": "b"}) == written
    assert rooms_.publish(room.code, room.secret, {"page": "c"}) == written
    assert rooms_.read(room.code).state == {"page": "a"}
    store.clock.advance(0.2)
    # ...and once the interval has passed, the latest view lands, in one write.
    deadline = time.monotonic() + 5
    while rooms_.read(room.code).state != {"page": "c"} and time.monotonic() < deadline:
        time.sleep(0.02)
    view = rooms_.read(room.code)
    assert (view.state, view.version) == ({"page": "c"}, written + 1)
    time.sleep(0.3)
    assert rooms_.read(room.code).version == written + 1  # "b" is never written after "c"


def test_a_direct_change_replaces_a_coalesced_one(store):
    rooms_ = make_rooms(store, publishes_per_s=10)
    room = rooms_.open_room(STATE)
    store.clock.advance(1)
    rooms_.publish(room.code, room.secret, {"page": "a"})
    rooms_.publish(room.code, room.secret, {"page": "stale"})  # coalesced, pending
    store.clock.advance(0.2)
    rooms_.publish(room.code, room.secret, {"page": "new"})  # written now
    store.clock.advance(0.2)
    time.sleep(0.4)  # the pending change's timer has fired by now (0.1 s), and its interval has passed
    assert rooms_.read(room.code).state == {"page": "new"}


def test_a_coalesced_change_that_fails_to_be_written_is_written_when_the_store_answers(store):
    """The store blips just when a coalesced change is written (the presenter's page had already counted it as
    published): the change is kept and tried again, sooner than a presenter would notice, until it lands."""
    failing = Failing(store, "put")
    rooms_ = make_rooms(failing, publishes_per_s=10)
    room = rooms_.open_room(STATE)
    store.clock.advance(1)
    rooms_.publish(room.code, room.secret, {"page": "a"})
    rooms_.publish(room.code, room.secret, {"page": "b"})  # coalesced: written once the interval has passed
    failing.fail = math.inf
    store.clock.advance(0.2)
    eventually(lambda: failing.failed >= 1)  # the timer's write failed
    failing.fail = 0
    eventually(lambda: rooms_.read(room.code).state == {"page": "b"})
    assert rooms_.unwritten(room.code) is None


def test_of_two_replicas_coalesced_changes_the_later_one_stays(store):
    """The presenter's reload lands on another replica within the coalescing interval of a change made on the
    first: each replica holds a coalesced change, and whichever timer writes last, the later change stays."""
    first, second = make_rooms(store, publishes_per_s=0.2), make_rooms(store, publishes_per_s=0.2)
    room = first.open_room(STATE)
    store.clock.advance(0.1)
    first.publish(room.code, room.secret, {"page": "older"})  # coalesced: written 5 s after the room opened
    store.clock.advance(0.1)
    second.resume(room.code, room.secret)
    second.publish(room.code, room.secret, {"page": "newer"})
    flush_now(second, room.code)
    flush_now(first, room.code)  # the older change's timer comes last
    assert first.read(room.code).state == {"page": "newer"}


def test_a_replica_back_on_the_view_stored_outlasts_an_older_change_another_holds(store):
    """The presenter goes from y to x on one replica (x held back), then, resumed on another, back to y, which the
    room already shows: nothing was written, and the first replica's timer wrote x over the presenter's latest."""
    first, second = make_rooms(store, publishes_per_s=0.2), make_rooms(store, publishes_per_s=0.2)
    room = first.open_room(STATE)
    store.clock.advance(10)
    version = first.publish(room.code, room.secret, {"page": "y"})  # written at once
    store.clock.advance(0.1)
    first.publish(room.code, room.secret, {"page": "x"})  # held back: within the interval
    store.clock.advance(0.1)
    second.resume(room.code, room.secret)
    assert second.publish(room.code, room.secret, {"page": "y"}) == version  # the view stored: no new version
    flush_now(first, room.code)
    view = first.read(room.code)
    assert (view.state, view.version) == ({"page": "y"}, version)


def test_a_change_the_store_did_not_take_is_sent_again_in_place_of_an_older_one_held_back(store):
    """A publish that failed for the store had been dropped: an older change held back landed after it, the class
    stayed there, and the presenter's page said the class would see the view once the store answered."""
    failing = Failing(store, "get")
    rooms_ = make_rooms(failing, publishes_per_s=10)
    room = rooms_.open_room(STATE)
    store.clock.advance(1)
    rooms_.publish(room.code, room.secret, {"page": "b"})
    rooms_.publish(room.code, room.secret, {"page": "c"})  # held back
    failing.fail = 1
    raises("unavailable", rooms_.publish, room.code, room.secret, {"page": "d"})
    assert rooms_.unwritten(room.code) == UNWRITTEN
    store.clock.advance(1)
    eventually(lambda: rooms_.read(room.code).state == {"page": "d"})
    assert rooms_.unwritten(room.code) is None


def test_a_code_drawn_again_leaves_the_live_room_counted_as_open(store, monkeypatch):
    """Drawing a live room's code had renewed its entry among the open rooms, then taken it out: the bound counted
    one room fewer, and let one more open."""
    drawn = iter("AAAAAAAAAAAABBBBBBCCCCCC")
    monkeypatch.setattr(room_module.secrets, "choice", lambda alphabet: next(drawn))
    rooms_ = make_rooms(store, rooms_open=2)
    assert [rooms_.open_room(STATE).code for _ in range(2)] == ["AAAAAA", "BBBBBB"]
    assert store.count("open") == 2
    raises("limit", rooms_.open_room, STATE)


def test_a_record_without_the_time_of_its_change_takes_a_coalesced_change(store):
    """A room that an earlier attnviz wrote (no time of the change in its record) takes the presenter's changes."""
    rooms_ = make_rooms(store, publishes_per_s=0.2)
    room = rooms_.open_room(STATE)
    key = f"room:{room.code}"
    revision, text = store.get(key)
    earlier = {k: v for k, v in json.loads(text).items() if k != "changed"}
    store.put(key, json.dumps(earlier), 3600, expect=revision)
    store.clock.advance(0.1)
    rooms_.publish(room.code, room.secret, {"page": "next"})
    flush_now(rooms_, room.code)
    assert rooms_.read(room.code).state == {"page": "next"}


@pytest.mark.parametrize("ahead", [("updated",), ("changed",), ("updated", "changed")], ids=" and ".join)
def test_a_coalesced_change_is_written_though_the_record_is_stamped_ahead_of_the_clock(store, ahead):
    """A record whose last write, or last change, is stamped a day ahead of this replica's clock (a hand edit,
    another machine's clock): the presenter's coalesced change is written once its interval has passed. It had
    been coalesced again on every try (a last write ahead of the clock), or dropped as older than the view stored
    (a change ahead of the clock), and the class kept the old view while the presenter's page counted it as
    published."""
    rooms_ = make_rooms(store, publishes_per_s=0.2)
    room = rooms_.open_room(STATE)
    key = f"room:{room.code}"
    revision, text = store.get(key)
    stamps = dict.fromkeys(ahead, store.clock() + 86_400)
    store.put(key, json.dumps({**json.loads(text), **stamps}), 3600, expect=revision)
    rooms_.publish(room.code, room.secret, {"page": "next"})
    flush_now(rooms_, room.code)
    assert rooms_.read(room.code).state == {"page": "next"}


def test_a_room_no_call_is_using_holds_no_lock(store):
    """The lock that keeps one writer at a time per room lives while a call uses it: rooms that expire, or whose
    presenter closes the tab without ending them, leave nothing behind in a replica."""
    rooms_ = make_rooms(store)
    for _ in range(5):
        room = rooms_.open_room(STATE)
        store.clock.advance(1)
        rooms_.publish(room.code, room.secret, {"page": "next"})
    store.clock.advance(4 * 3600)
    assert len(rooms_._locks) == 0


# Configuration, and a store that goes away


@pytest.fixture
def environment(monkeypatch, tmp_path):
    for name in ("ATTNVIZ_ROOMS_URL", "ATTNVIZ_ROOMS_DIR", "ATTNVIZ_ROOM_HOURS", "ATTNVIZ_ROOMS_OPEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return monkeypatch


def test_the_default_store_is_sqlite_in_the_users_cache(environment, tmp_path):
    room = rooms.open_room(STATE)
    assert (tmp_path / "cache" / "attnviz" / "rooms" / "rooms.sqlite3").is_file()
    assert rooms.read(room.code).state == STATE and rooms.store_status() is None
    environment.setenv("ATTNVIZ_ROOMS_DIR", str(tmp_path / "named"))
    raises("unknown", rooms.read, room.code)  # another folder, another store
    named = rooms.open_room(STATE)
    assert (tmp_path / "named" / "rooms.sqlite3").is_file()
    rooms.publish(named.code, named.secret, STATE)
    rooms.end(named.code, named.secret)


def test_redis_is_chosen_by_its_url(environment, redis_server):
    environment.setenv("ATTNVIZ_ROOMS_URL", redis_server.url)
    assert isinstance(rooms.store(), RedisStore)
    room = rooms.open_room(STATE)
    rooms.follow(room.code, "session")
    assert rooms.read(room.code).followers == 1


@pytest.mark.parametrize("database", ["abc", "1x", "0/extra", "-1", "99999999999999999999", "1?db=abc", "?db=x"])
def test_a_redis_database_that_is_no_whole_number_is_refused(environment, redis_server, caplog, database):
    """redis-py drops a database it cannot read, and the rooms went to database 0 of a Redis that answers without
    a word; -1 and 10**20 failed later, as a store that "does not answer"."""
    environment.setenv("ATTNVIZ_ROOMS_URL", redis_server.url.removesuffix("/0") + "/" + database)
    assert rooms.store_status() == UNAVAILABLE
    said = [r.getMessage() for r in caplog.records if "ATTNVIZ_ROOMS_URL" in r.getMessage()]
    assert any("database" in line and "whole number" in line for line in said), said
    raises("unavailable", rooms.open_room, STATE)


def test_the_operators_limits_come_from_the_environment(environment):
    environment.setenv("ATTNVIZ_ROOM_HOURS", "0.5")
    environment.setenv("ATTNVIZ_ROOMS_OPEN", "1")
    environment.setenv("ATTNVIZ_ROOM_STATE_KB", "not a number")  # unreadable: its default
    limits = Limits.from_environment()
    assert (limits.hours, limits.rooms_open, limits.state_bytes) == (0.5, 1, Limits().state_bytes)
    rooms.open_room(STATE)
    raises("limit", rooms.open_room, STATE)


@pytest.mark.parametrize("where", ["sqlite", "redis"])
def test_the_operators_limits_are_bounded_and_a_value_beyond_is_said_once(environment, caplog, request, where):
    """A lifetime of 1e306 hours became infinity (rooms that opened and could not be read, or a traceback on
    Redis); half a room open at once became none."""
    if where == "redis":
        environment.setenv("ATTNVIZ_ROOMS_URL", request.getfixturevalue("redis_server").url)
    environment.setattr(settings, "_said", set())  # what this process has said so far
    caplog.set_level(logging.WARNING, logger=settings.__name__)
    environment.setenv("ATTNVIZ_ROOM_HOURS", "1e306")
    most = settings.MOST_HOURS
    assert Limits.from_environment().hours == most
    room = rooms.open_room({})
    assert rooms.read(room.code).state == {}
    said = [r.getMessage() for r in caplog.records if "ATTNVIZ_ROOM_HOURS" in r.getMessage()]
    assert len(said) == 1 and f"{most:g}" in said[0], said  # once, not on every call
    for name in ("ATTNVIZ_ROOMS_OPEN", "ATTNVIZ_ROOMS_PER_MINUTE", "ATTNVIZ_ROOM_FOLLOWERS", "ATTNVIZ_ROOM_STATE_KB"):
        environment.setenv(name, "0.5")
    limits = Limits.from_environment()
    assert (limits.rooms_open, limits.per_minute, limits.followers, limits.state_bytes) == (1, 1, 1, 1024)


@pytest.mark.parametrize("setting", [("ATTNVIZ_ROOMS_URL", "ftp://example.org"), ("ATTNVIZ_ROOMS_DIR", "FILE")])
def test_a_store_that_cannot_be_used_gives_one_line(environment, tmp_path, setting):
    name, value = setting
    if value == "FILE":
        (tmp_path / "a-file").write_text("")
        value = str(tmp_path / "a-file" / "rooms")  # a folder cannot be made inside a file
    environment.setenv(name, value)
    assert rooms.store_status() == UNAVAILABLE
    error = raises("unavailable", rooms.open_room, STATE)
    assert value not in str(error)  # the visitor learns nothing of the server's folders or addresses
    raises("unavailable", rooms.read, "K7QX2M")
    raises("unavailable", rooms.follow, "K7QX2M", "session")


def test_store_errors_are_store_errors(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreError):
        SQLiteStore(tmp_path / "a-file" / "rooms").check()


def test_a_writer_stalled_in_another_process_holds_up_no_other_call_of_this_one(tmp_path, monkeypatch):
    """Another process holds the file's write lock (a replica stopped mid-write, a backup): each writer of this
    replica waits for it on its own, and its reads go on (WAL). Every room call of the replica had queued behind
    the first writer's wait, two seconds each: a poll of the k-th session took k x 2 s."""
    waiting = []  # a connection's thread each time it starts waiting for the write lock

    class Noted(sqlite3.Connection):
        def execute(self, sql, *args):
            if sql == "BEGIN IMMEDIATE":
                waiting.append(threading.current_thread())
            return super().execute(sql, *args)

    plain = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", functools.partial(plain, factory=Noted))
    monkeypatch.setattr(sqlite_store, "BUSY_MS", 5000)
    store = SQLiteStore(tmp_path / "rooms")
    store.put("k", "v", 60)
    holder = plain(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the other process's writer, stalled
    waiting.clear()
    writers = [threading.Thread(target=store.put, args=("k", "w", 60), daemon=True) for _ in range(2)]
    for writer in writers:
        writer.start()
    try:
        eventually(lambda: len(set(waiting)) == 2, seconds=2.5)  # both wait at once, neither behind the other
        assert within(2.5, store.get, "k") == (1, "v")
    finally:
        holder.execute("ROLLBACK")
        for writer in writers:
            writer.join(10)
    assert store.get("k") == (3, "w")


def within(seconds: float, call, *args):
    """What ``call(*args)`` returns or raises, failing the test if it takes longer than ``seconds``."""
    outcome: list = []

    def run():
        try:
            outcome.append(("value", call(*args)))
        except BaseException as e:  # noqa: BLE001  (handed back to the test)
            outcome.append(("error", e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{getattr(call, '__name__', call)} did not answer within {seconds} s"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def presenter_and_follower_calls(rooms_: Rooms, room) -> list:
    return [
        (rooms_.read, (room.code,)),
        (rooms_.follow, (room.code, "session")),
        (rooms_.publish, (room.code, room.secret, {"page": "next"})),  # the presenter's page shows a warning
        (rooms_.open_room, (STATE,)),
    ]


def assert_unavailable_within(seconds: float, rooms_: Rooms, room) -> None:
    assert within(seconds, rooms_.store_status) == UNAVAILABLE
    for call, args in presenter_and_follower_calls(rooms_, room):
        with pytest.raises(RoomError) as caught:
            within(seconds, call, *args)
        assert caught.value.reason == "unavailable" and str(caught.value) == UNAVAILABLE


# redis-py's own retries make each failed call take about 2.6 s (4.5 s without socket timeouts); ours, 0.5 s at most.
QUICKLY_S = 1.5


def test_a_redis_that_goes_away_gives_one_line_quickly(tmp_path):
    server = RedisServer(tmp_path / "redis")
    try:
        made = RedisStore(server.url)
        rooms_ = Rooms(lambda: made, Limits)
        room = rooms_.open_room(STATE)
        rooms_.follow(room.code, "session")
        assert rooms_.store_status() is None
        server.stop()
        assert_unavailable_within(QUICKLY_S, rooms_, room)
    finally:
        server.stop()


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_a_redis_that_hangs_gives_one_line_quickly_and_comes_back(tmp_path):
    server = RedisServer(tmp_path / "redis")
    try:
        made = RedisStore(server.url)
        rooms_ = Rooms(lambda: made, Limits)
        room = rooms_.open_room(STATE)
        server.proc.send_signal(signal.SIGSTOP)  # the machine stops answering; its connections stay open
        assert_unavailable_within(QUICKLY_S, rooms_, room)
        server.proc.send_signal(signal.SIGCONT)
        assert rooms_.store_status() is None
        assert rooms_.read(room.code).state == STATE
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.stop()


def test_a_store_that_does_not_answer_is_logged_once_a_while_not_once_a_poll(caplog, monkeypatch):
    """Every follower's poll fails while the store is down: thirty followers had written sixty WARNING lines a
    second. One line, then one per `STORE_DOWN_SAID_S` seconds with the count of failures between."""
    from attnviz.app.rooms import room as room_module

    clock = [1000.0]
    monkeypatch.setattr(room_module.time, "monotonic", lambda: clock[0])
    failing = Failing(MemoryStore(), "get", "check")
    rooms_ = make_rooms(failing)
    failing.fail = math.inf
    with caplog.at_level(logging.WARNING, logger="attnviz.app.rooms.room"):
        for _ in range(50):
            raises("unavailable", rooms_.read, "K7QX2M")
            assert rooms_.store_status() is not None
        clock[0] += room_module.STORE_DOWN_SAID_S
        raises("unavailable", rooms_.read, "K7QX2M")
    lines = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "Timeout reading from socket" in lines[0] and "99 more failures" in lines[1], lines
    assert failing.failed == 101, "every call still goes to the store: it is not skipped while quiet"
