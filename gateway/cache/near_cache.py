"""A short-lived in-process copy of recently read shared-store entries.

A cache hit through Redis costs several times the CPU of the rest of the hit (a round
trip through redis-py); hot keys are read over and over, and entries never change once
written, except by an explicit refresh (`x-detgate-cache-control: no-cache`). So each
replica keeps what it read for `ttl_s`: a refresh made on another replica is seen here
after at most that long, and a refresh made here is seen at once. A copy never outlives
its entry: an entry with a TTL is read with the time it has left, and copied for no longer.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

from gateway.cache.store import Store
from gateway.cache.store_wrapper import StoreWrapper


class NearCache(StoreWrapper):
    def __init__(self, store: Store, ttl_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(store)
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._clock = clock
        self._copies: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # key -> (expires, value)

    async def get(self, key: str) -> bytes | None:
        copy = self._copies.get(key)
        if copy is not None:
            if copy[0] > self._clock():
                return copy[1]
            self._forget(key)
        value, left = await self.store.get_expiring(key)
        if value is not None:
            self._remember(key, value, left)
        return value

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False, ttl_ms: int = 0) -> bool:
        stored = await self.store.commit(key, value, owner, overwrite=overwrite, ttl_ms=ttl_ms)
        if stored:
            self._remember(key, value, ttl_ms / 1000 if ttl_ms else None)
        else:
            self._forget(key)
        return stored

    def _remember(self, key: str, value: bytes, left: float | None) -> None:
        self._forget(key)
        size = len(key) + len(value)
        if size > self.max_bytes:
            return
        while self.nbytes + size > self.max_bytes:
            self._forget(next(iter(self._copies)))
        self._copies[key] = (self._clock() + min(self.ttl_s, self.ttl_s if left is None else left), value)
        self.nbytes += size

    def _forget(self, key: str) -> None:
        copy = self._copies.pop(key, None)
        if copy is not None:
            self.nbytes -= len(key) + len(copy[1])

    async def delete_if(self, key: str, mac: bytes) -> bool:
        # This replica forgets its copy at once; the others within their ttl_s.
        self._forget(key)
        return await self.store.delete_if(key, mac)

    async def close(self) -> None:
        self._copies.clear()
        self.nbytes = 0
        await self.store.close()
