"""The shared store: Redis, so replicas share entries and fill locks and entries outlive restarts."""
from __future__ import annotations

from typing import AsyncIterator

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.cache.store import StoreError


# The cache key in braces is a Redis Cluster hash tag: an entry and its fill lock live in
# one slot, so the commit script may touch both.
def entry_name(key: str) -> str:
    return f"detgate:e:{{{key}}}"


_ENTRY_PREFIX = entry_name("")[:-2]  # "detgate:e:", before the braces


def lock_name(key: str) -> str:
    return f"detgate:l:{{{key}}}"


# Renew or release only a lock we still own: a holder whose lease ran out must not
# extend or delete the claim of the replica that took over.
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
# KEYS: entry, lock. ARGV: value, owner, "1" to overwrite, TTL in ms ("0": none). One round
# trip for the end of a fill.
_COMMIT = """
local set = {'set', KEYS[1], ARGV[1]}
if ARGV[3] ~= '1' then table.insert(set, 'NX') end
if ARGV[4] ~= '0' then table.insert(set, 'PX'); table.insert(set, ARGV[4]) end
local stored = redis.call(unpack(set)) and 1 or 0
if redis.call('get', KEYS[2]) == ARGV[2] then redis.call('del', KEYS[2]) end
return stored
"""
# Delete an entry only while it still holds the value the caller chose it by (its MAC, the
# value's first bytes): a refresh or a new fill that landed since is left alone.
_DELETE_IF = ("local v = redis.call('get', KEYS[1]) "
              "if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then return redis.call('del', KEYS[1]) "
              "else return 0 end")
# An entry and the milliseconds it has left (-1: no TTL), in one round trip.
_GET_EXPIRING = "return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1])}"


CLUSTER_SCHEME = "redis+cluster://"


def connect(url: str, timeout_s: float = 1.0, max_connections: int = 256) -> aioredis.Redis | aioredis.RedisCluster:
    """A client for `url`; "redis+cluster://host:port" (any one node) means Redis Cluster.

    Every operation is bounded by `timeout_s` (connecting, and waiting for a reply), so a
    hung Redis costs a request at most that long. A connection that broke (Redis was
    restarted) is retried once at once on a fresh one; past that the store is down.
    """
    options = dict(max_connections=max_connections, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                   retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))
    if url.startswith(CLUSTER_SCHEME):
        return aioredis.RedisCluster.from_url("redis://" + url[len(CLUSTER_SCHEME):], **options)
    return aioredis.Redis.from_url(url, **options)


class RedisStore:
    def __init__(self, url: str, timeout_s: float = 1.0, max_connections: int = 256) -> None:
        self._redis = connect(url, timeout_s, max_connections)
        self._renew = self._redis.register_script(_RENEW)
        self._unlock = self._redis.register_script(_UNLOCK)
        self._commit = self._redis.register_script(_COMMIT)
        self._get_expiring = self._redis.register_script(_GET_EXPIRING)
        self._delete_if = self._redis.register_script(_DELETE_IF)

    @property
    def client(self) -> aioredis.Redis | aioredis.RedisCluster:
        """For others that keep their state in the same Redis (shared rate limits)."""
        return self._redis

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except RedisError as exc:
            raise StoreError.of("redis", exc) from exc

    async def get(self, key: str) -> bytes | None:
        try:
            return await self._redis.get(entry_name(key))
        except RedisError as exc:
            raise StoreError.of("redis get", exc) from exc

    async def get_expiring(self, key: str) -> tuple[bytes | None, float | None]:
        try:
            value, left_ms = await self._get_expiring(keys=[entry_name(key)])
        except RedisError as exc:
            raise StoreError.of("redis get", exc) from exc
        return value, (left_ms / 1000 if left_ms >= 0 else None)

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False, ttl_ms: int = 0) -> bool:
        try:
            return bool(await self._commit(keys=[entry_name(key), lock_name(key)],
                                           args=[value, owner, "1" if overwrite else "0", str(int(ttl_ms))]))
        except RedisError as exc:
            raise StoreError.of("redis commit", exc) from exc

    async def try_lock(self, key: str, owner: str, lease_ms: int) -> bool:
        try:
            return bool(await self._redis.set(lock_name(key), owner, nx=True, px=lease_ms))
        except RedisError as exc:
            raise StoreError.of("redis lock", exc) from exc

    async def renew(self, key: str, owner: str, lease_ms: int) -> bool:
        try:
            return bool(await self._renew(keys=[lock_name(key)], args=[owner, lease_ms]))
        except RedisError as exc:
            raise StoreError.of("redis renew", exc) from exc

    async def unlock(self, key: str, owner: str) -> None:
        try:
            await self._unlock(keys=[lock_name(key)], args=[owner])
        except RedisError as exc:
            raise StoreError.of("redis unlock", exc) from exc

    async def keys(self) -> AsyncIterator[str]:
        # SCAN, not KEYS: a large cache is walked in slices without blocking Redis.
        try:
            async for name in self._redis.scan_iter(match=_ENTRY_PREFIX + "*", count=1000):
                yield name.decode()[len(_ENTRY_PREFIX) + 1:-1]
        except RedisError as exc:
            raise StoreError.of("redis scan", exc) from exc

    async def scan(self, cursor: str, count: int) -> tuple[list[str], str]:
        """One SCAN step: up to about `count` keys and the cursor to go on from ("" at the end,
        and to start). On a cluster the cursor is "node.cursor", walking the primaries in turn."""
        try:
            if isinstance(self._redis, aioredis.RedisCluster):
                nodes = sorted(self._redis.get_primaries(), key=lambda node: node.name)
                index, _, at = cursor.partition(".") if cursor else ("0", "", "0")
                node = nodes[int(index)]
                found, names = await self._redis.scan(cursor=int(at), match=_ENTRY_PREFIX + "*", count=count,
                                                      target_nodes=node)
                nxt = found[node.name]
                following = f"{index}.{nxt}" if nxt else (f"{int(index) + 1}.0" if int(index) + 1 < len(nodes) else "")
            else:
                nxt, names = await self._redis.scan(cursor=int(cursor or 0), match=_ENTRY_PREFIX + "*", count=count)
                following = str(nxt) if nxt else ""
        except (ValueError, IndexError):
            raise ValueError(f"not a cursor this store gave: {cursor!r}") from None
        except RedisError as exc:
            raise StoreError.of("redis scan", exc) from exc
        return [name.decode()[len(_ENTRY_PREFIX) + 1:-1] for name in names], following

    async def delete_if(self, key: str, mac: bytes) -> bool:
        try:
            return bool(await self._delete_if(keys=[entry_name(key)], args=[mac]))
        except RedisError as exc:
            raise StoreError.of("redis delete", exc) from exc

    async def close(self) -> None:
        await self._redis.aclose()
