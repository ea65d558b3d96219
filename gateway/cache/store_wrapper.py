"""The base of stores that wrap another: every operation passes through unless overridden,
so a wrapper states only what it changes (the near cache, the traced store)."""
from __future__ import annotations

from typing import Any, AsyncIterator


class StoreWrapper:
    def __init__(self, store: Any) -> None:
        self.store = store

    async def get(self, key: str) -> bytes | None:
        return await self.store.get(key)

    async def get_expiring(self, key: str) -> tuple[bytes | None, float | None]:
        return await self.store.get_expiring(key)

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False, ttl_ms: int = 0) -> bool:
        return await self.store.commit(key, value, owner, overwrite=overwrite, ttl_ms=ttl_ms)

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
