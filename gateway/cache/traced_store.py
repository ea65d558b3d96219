"""A store whose lookups and writes are child spans of the request's trace. Installed only
when tracing is on (gateway/ops/tracing.py), so the hit path pays nothing otherwise."""
from __future__ import annotations

from typing import Any, AsyncIterator

from gateway.ops import tracing


class TracedStore:
    def __init__(self, store: Any) -> None:
        self.store = store

    async def get(self, key: str) -> bytes | None:
        with tracing.span("detgate.cache.lookup", {"detgate.key_prefix": key[:tracing.KEY_PREFIX_CHARS]}) as span:
            value = await self.store.get(key)
            if span is not None:
                span.set_attribute("detgate.cache.found", value is not None)
            return value

    async def get_expiring(self, key: str) -> tuple[bytes | None, float | None]:
        with tracing.span("detgate.cache.lookup", {"detgate.key_prefix": key[:tracing.KEY_PREFIX_CHARS]}):
            return await self.store.get_expiring(key)

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False, ttl_ms: int = 0) -> bool:
        with tracing.span("detgate.cache.store", {"detgate.key_prefix": key[:tracing.KEY_PREFIX_CHARS]}) as span:
            stored = await self.store.commit(key, value, owner, overwrite=overwrite, ttl_ms=ttl_ms)
            if span is not None:
                span.set_attribute("detgate.cache.stored", stored)
            return stored

    async def ping(self) -> None:
        await self.store.ping()

    async def try_lock(self, key: str, owner: str, lease_ms: int) -> bool:
        return await self.store.try_lock(key, owner, lease_ms)

    async def renew(self, key: str, owner: str, lease_ms: int) -> bool:
        return await self.store.renew(key, owner, lease_ms)

    async def unlock(self, key: str, owner: str) -> None:
        await self.store.unlock(key, owner)

    def keys(self) -> AsyncIterator[str]:
        return self.store.keys()

    async def scan(self, cursor: str, count: int) -> tuple[list[str], str]:
        return await self.store.scan(cursor, count)

    async def delete_if(self, key: str, mac: bytes) -> bool:
        return await self.store.delete_if(key, mac)

    async def close(self) -> None:
        await self.store.close()
