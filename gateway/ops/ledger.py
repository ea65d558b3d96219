"""Small shared facts about upstreams: fingerprints seen, namespace epochs, canary digests,
and whose turn it is to run the canaries.

Kept in Redis when the gateway has one, so every replica reads and writes the same
facts (a rotation made by one replica is seen by all), else in this process. Both
speak string-keyed hashes and one bounded event list; each operation that decides
something (who saw a fingerprint first, which digest is a canary's reference) is a
single atomic command, so replicas racing on it agree on the winner.
"""
from __future__ import annotations

import time
from typing import Protocol

from redis.exceptions import RedisError

from gateway.cache.redis_store import connect
from gateway.cache.store import StoreError


class Ledger(Protocol):
    kind: str

    async def claim(self, table: str, field: str, value: str) -> str:
        """Set `field` to `value` unless set already; what is stored afterwards."""
        ...

    async def swap(self, table: str, field: str, value: str) -> str | None:
        """Set `field` to `value`; what it held before."""
        ...

    async def put(self, table: str, field: str, value: str) -> None: ...

    async def incr(self, table: str, field: str) -> int: ...

    async def raise_to(self, table: str, field: str, value: int) -> int:
        """Set the integer `field` to `value` unless it holds more already; what it holds afterwards."""
        ...

    async def read(self, table: str) -> dict[str, str]: ...

    async def push(self, log: str, value: str, keep: int) -> None:
        """Prepend to a list that keeps its `keep` newest values."""
        ...

    async def recent(self, log: str, count: int) -> list[str]:
        """Newest first."""
        ...

    async def turn(self, name: str, lease_ms: int) -> bool:
        """True for the first caller in `lease_ms`, whichever replica it is."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


class MemoryLedger:
    kind = "in-process"

    def __init__(self) -> None:
        self._tables: dict[str, dict[str, str]] = {}
        self._logs: dict[str, list[str]] = {}
        self._turns: dict[str, float] = {}

    def _table(self, table: str) -> dict[str, str]:
        return self._tables.setdefault(table, {})

    async def claim(self, table: str, field: str, value: str) -> str:
        return self._table(table).setdefault(field, value)

    async def swap(self, table: str, field: str, value: str) -> str | None:
        rows = self._table(table)
        old, rows[field] = rows.get(field), value
        return old

    async def put(self, table: str, field: str, value: str) -> None:
        self._table(table)[field] = value

    async def incr(self, table: str, field: str) -> int:
        rows = self._table(table)
        rows[field] = str(int(rows.get(field, "0")) + 1)
        return int(rows[field])

    async def raise_to(self, table: str, field: str, value: int) -> int:
        rows = self._table(table)
        rows[field] = str(max(int(rows.get(field, "0")), value))
        return int(rows[field])

    async def read(self, table: str) -> dict[str, str]:
        return dict(self._table(table))

    async def push(self, log: str, value: str, keep: int) -> None:
        values = self._logs.setdefault(log, [])
        values.insert(0, value)
        del values[keep:]

    async def recent(self, log: str, count: int) -> list[str]:
        return self._logs.get(log, [])[:count]

    async def turn(self, name: str, lease_ms: int) -> bool:
        now = time.monotonic()
        if self._turns.get(name, 0.0) > now:
            return False
        self._turns[name] = now + lease_ms / 1000
        return True

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


_PREFIX = "detgate:ledger:"  # apart from detgate:e:* so cache export never sees these

# One key per script, so each runs atomically on plain Redis and on Redis Cluster alike.
_CLAIM = "redis.call('hsetnx', KEYS[1], ARGV[1], ARGV[2]) return redis.call('hget', KEYS[1], ARGV[1])"
_SWAP = "local old = redis.call('hget', KEYS[1], ARGV[1]) redis.call('hset', KEYS[1], ARGV[1], ARGV[2]) return old"
_RAISE = ("local now = math.max(tonumber(redis.call('hget', KEYS[1], ARGV[1]) or '0'), tonumber(ARGV[2])) "
          "redis.call('hset', KEYS[1], ARGV[1], now) return now")
_PUSH = "redis.call('lpush', KEYS[1], ARGV[1]) redis.call('ltrim', KEYS[1], 0, tonumber(ARGV[2]) - 1)"


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


class RedisLedger:
    kind = "redis"

    def __init__(self, url: str, timeout_s: float) -> None:
        self._redis = connect(url, timeout_s, max_connections=16)
        self._claim = self._redis.register_script(_CLAIM)
        self._swap = self._redis.register_script(_SWAP)
        self._push = self._redis.register_script(_PUSH)
        self._raise = self._redis.register_script(_RAISE)

    async def _run(self, what: str, call):
        try:
            return await call
        except RedisError as exc:
            raise StoreError.of(f"redis {what}", exc) from exc

    async def claim(self, table: str, field: str, value: str) -> str:
        return _text(await self._run("claim", self._claim(keys=[_PREFIX + table], args=[field, value])))

    async def swap(self, table: str, field: str, value: str) -> str | None:
        return _text(await self._run("swap", self._swap(keys=[_PREFIX + table], args=[field, value])))

    async def put(self, table: str, field: str, value: str) -> None:
        await self._run("put", self._redis.hset(_PREFIX + table, field, value))

    async def incr(self, table: str, field: str) -> int:
        return int(await self._run("incr", self._redis.hincrby(_PREFIX + table, field, 1)))

    async def raise_to(self, table: str, field: str, value: int) -> int:
        return int(await self._run("raise", self._raise(keys=[_PREFIX + table], args=[field, value])))

    async def read(self, table: str) -> dict[str, str]:
        rows = await self._run("read", self._redis.hgetall(_PREFIX + table))
        return {k.decode(): v.decode() for k, v in rows.items()}

    async def push(self, log: str, value: str, keep: int) -> None:
        await self._run("push", self._push(keys=[_PREFIX + log], args=[value, keep]))

    async def recent(self, log: str, count: int) -> list[str]:
        return [v.decode() for v in await self._run("recent", self._redis.lrange(_PREFIX + log, 0, count - 1))]

    async def turn(self, name: str, lease_ms: int) -> bool:
        return bool(await self._run("turn", self._redis.set(f"{_PREFIX}turn:{name}", "1", nx=True, px=lease_ms)))

    async def ping(self) -> None:
        await self._run("ping", self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()


def open_ledger(redis_url: str | None, timeout_s: float) -> Ledger:
    return RedisLedger(redis_url, timeout_s) if redis_url else MemoryLedger()
