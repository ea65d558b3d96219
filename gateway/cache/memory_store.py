"""The embedded store: an in-process LRU bounded by bytes, so `detgate serve` needs nothing else.

Locks here only ever meet other flights of the same process, which the in-process
single-flight has already merged; they exist so the fill protocol is the same for both stores.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import AsyncIterator


class MemoryStore:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._locks: dict[str, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False) -> bool:
        await self.unlock(key, owner)
        if overwrite:
            self._drop(key)
        elif key in self._entries:
            self._entries.move_to_end(key)
            return False
        return self._insert(key, value)

    def _insert(self, key: str, value: bytes) -> bool:
        size = len(key) + len(value)
        if size > self.max_bytes:
            return False  # would evict everything and still not fit
        while self.nbytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[key] = value
        self.nbytes += size
        return True

    def _drop(self, key: str) -> None:
        value = self._entries.pop(key, None)
        if value is not None:
            self.nbytes -= len(key) + len(value)

    async def try_lock(self, key: str, owner: str, lease_ms: int) -> bool:
        now = time.monotonic()
        held = self._locks.get(key)
        if held is not None and held[1] > now and held[0] != owner:
            return False
        self._locks[key] = (owner, now + lease_ms / 1000)
        return True

    async def renew(self, key: str, owner: str, lease_ms: int) -> bool:
        held = self._locks.get(key)
        if held is None or held[0] != owner:
            return False
        self._locks[key] = (owner, time.monotonic() + lease_ms / 1000)
        return True

    async def unlock(self, key: str, owner: str) -> None:
        held = self._locks.get(key)
        if held is not None and held[0] == owner:
            del self._locks[key]

    async def keys(self) -> AsyncIterator[str]:
        for key in list(self._entries):
            yield key

    async def close(self) -> None:
        self._entries.clear()
        self._locks.clear()
        self.nbytes = 0
