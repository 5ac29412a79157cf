"""The rooms' store across machines: Redis, where ``ATTNVIZ_ROOMS_URL=redis://...`` is set.

Needs the ``redis`` package (``pip install 'attnviz[rooms]'``). A record is a hash (its revision
and value) with the key's own time to live; a group is a sorted set whose scores are the members'
expiry times. Compare-and-set and "join unless full" are short Lua scripts, so each is atomic
whatever the number of replicas.

A Redis that goes away must cost a visitor about a second, not a page that hangs: the client uses
short socket timeouts and no retries (redis-py 8 otherwise retries a failed command for about
4.5 s), and every failure becomes a `StoreError`.

Answers come as bytes, and `get` decodes a record's value itself: bytes that are not UTF-8 (another
program on the same database, a hand edit) are a record that is not a room's, which the rooms say
in one line, not a UnicodeDecodeError.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from attnviz.app.rooms.store import StoreError
from attnviz.app.rooms.store import revision_of as _revision

PREFIX = "attnviz:rooms:"
NOT_TEXT = ""  # `get`'s value for bytes that are not UTF-8: no record of the rooms' is empty, none reads as one
TIMEOUT_S = 0.5  # connecting, and waiting for an answer: loopback or a LAN answers in milliseconds

PUT = """
local revision = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if ARGV[3] ~= '' and tonumber(ARGV[3]) ~= revision then return 0 end
redis.call('HSET', KEYS[1], 'revision', revision + 1, 'value', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return revision + 1
"""

JOIN = """
local now, expires, ttl_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[5] ~= '' and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[5]) then return 0 end
end
redis.call('ZADD', KEYS[1], expires, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl_ms then redis.call('PEXPIRE', KEYS[1], ttl_ms) end
return 1
"""


class RedisStore:
    """A `Store` in the Redis server at ``url`` (``redis://host:port/db``, ``rediss://``, ``unix://``)."""

    def __init__(self, url: str, clock: Callable[[], float] = time.time):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as e:
            raise StoreError(
                "ATTNVIZ_ROOMS_URL names a Redis server, but the redis package is not installed "
                "(pip install 'attnviz[rooms]')"
            ) from e
        self.clock = clock
        self._errors = (redis.RedisError, OSError)
        try:
            self._redis = redis.Redis.from_url(
                url,
                socket_timeout=TIMEOUT_S,
                socket_connect_timeout=TIMEOUT_S,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
            )
        except ValueError as e:
            raise StoreError(f"ATTNVIZ_ROOMS_URL is not a Redis address: {e}") from e
        self._put = self._redis.register_script(PUT)
        self._join = self._redis.register_script(JOIN)

    def _call(self, work: Callable[[], object]):
        try:
            return work()
        except self._errors as e:
            raise StoreError(f"the rooms' Redis does not answer: {e}") from e

    def get(self, key: str) -> tuple[int, str] | None:
        found = self._call(lambda: self._redis.hmget(PREFIX + key, "revision", "value"))
        if found[0] is None or found[1] is None:
            return None
        try:
            value = found[1].decode("utf-8")
        except UnicodeDecodeError:
            value = NOT_TEXT
        return _revision(found[0]), value

    def put(self, key: str, value: str, ttl: float, expect: int | None = None) -> int | None:
        args = [value, max(1, math.ceil(ttl * 1000)), "" if expect is None else str(expect)]
        revision = int(self._call(lambda: self._put(keys=[PREFIX + key], args=args)))
        return revision or None

    def join(self, group: str, member: str, ttl: float, most: int | None = None) -> bool:
        now = self.clock()
        args = [member, repr(now), repr(now + ttl), max(1, math.ceil(ttl * 1000)), "" if most is None else str(most)]
        return bool(int(self._call(lambda: self._join(keys=[PREFIX + "group:" + group], args=args))))

    def count(self, group: str) -> int:
        return int(self._call(lambda: self._redis.zcount(PREFIX + "group:" + group, f"({self.clock()!r}", "+inf")))

    def leave(self, group: str, member: str) -> None:
        self._call(lambda: self._redis.zrem(PREFIX + "group:" + group, member))

    def check(self) -> None:
        self._call(self._redis.ping)
