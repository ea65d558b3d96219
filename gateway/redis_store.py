"""The shared store: Redis, so replicas share entries and fill locks and entries outlive restarts."""
from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.store import StoreError

# The cache key in braces is a Redis Cluster hash tag: an entry and its fill lock live in
# one slot, so the commit script may touch both.
def entry_name(key: str) -> str:
    return f"detgate:e:{{{key}}}"


def lock_name(key: str) -> str:
    return f"detgate:l:{{{key}}}"


# Renew or release only a lock we still own: a holder whose lease ran out must not
# extend or delete the claim of the replica that took over.
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
# KEYS: entry, lock. ARGV: value, owner, "1" to overwrite. One round trip for the end of a fill.
_COMMIT = """
local stored = 1
if ARGV[3] == '1' then
  redis.call('set', KEYS[1], ARGV[1])
elseif not redis.call('set', KEYS[1], ARGV[1], 'NX') then
  stored = 0
end
if redis.call('get', KEYS[2]) == ARGV[2] then redis.call('del', KEYS[2]) end
return stored
"""


class RedisStore:
    def __init__(self, url: str, max_connections: int = 256) -> None:
        self._redis = aioredis.Redis.from_url(url, max_connections=max_connections)
        self._renew = self._redis.register_script(_RENEW)
        self._unlock = self._redis.register_script(_UNLOCK)
        self._commit = self._redis.register_script(_COMMIT)

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc

    async def get(self, key: str) -> bytes | None:
        try:
            return await self._redis.get(entry_name(key))
        except RedisError as exc:
            raise StoreError(f"redis get: {exc}") from exc

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False) -> bool:
        try:
            return bool(await self._commit(keys=[entry_name(key), lock_name(key)],
                                           args=[value, owner, "1" if overwrite else "0"]))
        except RedisError as exc:
            raise StoreError(f"redis commit: {exc}") from exc

    async def try_lock(self, key: str, owner: str, lease_ms: int) -> bool:
        try:
            return bool(await self._redis.set(lock_name(key), owner, nx=True, px=lease_ms))
        except RedisError as exc:
            raise StoreError(f"redis lock: {exc}") from exc

    async def renew(self, key: str, owner: str, lease_ms: int) -> bool:
        try:
            return bool(await self._renew(keys=[lock_name(key)], args=[owner, lease_ms]))
        except RedisError as exc:
            raise StoreError(f"redis renew: {exc}") from exc

    async def unlock(self, key: str, owner: str) -> None:
        try:
            await self._unlock(keys=[lock_name(key)], args=[owner])
        except RedisError as exc:
            raise StoreError(f"redis unlock: {exc}") from exc

    async def close(self) -> None:
        await self._redis.aclose()
