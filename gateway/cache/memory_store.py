"""The embedded store: an in-process LRU bounded by bytes, so `detgate serve` needs nothing else.

Locks here only ever meet other flights of the same process, which the in-process
single-flight has already merged; they exist so the fill protocol is the same for both stores.
An entry past its TTL is dropped when it is next touched, and LRU eviction takes the
rest in time.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import AsyncIterator, Callable


class MemoryStore:
    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._clock = clock
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._expires: dict[str, float] = {}  # key -> clock time it ages out, for entries with a TTL
        self._locks: dict[str, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        value = self._entries.get(key)
        if value is None:
            return None
        if key in self._expires and self._expires[key] <= self._clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return value

    async def get_expiring(self, key: str) -> tuple[bytes | None, float | None]:
        value = self._entries.get(key)
        if value is None:
            return None, None
        left = self._left(key)
        if left is not None and left <= 0:
            self._drop(key)
            return None, None
        self._entries.move_to_end(key)
        return value, left

    def _left(self, key: str) -> float | None:
        expires = self._expires.get(key)
        return None if expires is None else expires - self._clock()

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False, ttl_ms: int = 0) -> bool:
        await self.unlock(key, owner)
        left = self._left(key)
        if overwrite or (left is not None and left <= 0):
            self._drop(key)
        elif key in self._entries:
            self._entries.move_to_end(key)
            return False
        return self._insert(key, value, ttl_ms)

    def _insert(self, key: str, value: bytes, ttl_ms: int) -> bool:
        size = len(key) + len(value)
        if size > self.max_bytes:
            return False  # would evict everything and still not fit
        while self.nbytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[key] = value
        self.nbytes += size
        if ttl_ms:
            self._expires[key] = self._clock() + ttl_ms / 1000
        return True

    def _drop(self, key: str) -> None:
        value = self._entries.pop(key, None)
        self._expires.pop(key, None)
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
            left = self._left(key)
            if left is None or left > 0:
                yield key

    async def ping(self) -> None:
        """Always there: it lives in this process."""

    async def scan(self, cursor: str, count: int) -> tuple[list[str], str]:
        """Keys after `cursor` in sorted order, so that paging is stable however the LRU
        reorders them; the cursor is the last key of the page ("" at the end, and to start)."""
        keys = sorted(k for k in self._entries if k > cursor)[:count]
        return keys, (keys[-1] if len(keys) == count else "")

    async def delete_if(self, key: str, mac: bytes) -> bool:
        value = self._entries.get(key)
        if value is None or not value.startswith(mac):
            return False
        self._drop(key)
        return True

    async def close(self) -> None:
        self._entries.clear()
        self._expires.clear()
        self._locks.clear()
        self.nbytes = 0
