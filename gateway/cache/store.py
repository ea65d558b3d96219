"""What the gateway needs from a cache store, whichever one is configured.

Entries are written first-writer-wins and never change afterwards (except by an explicit
refresh). Fill locks carry a lease so that a dead holder's claim runs out by itself.
"""
from __future__ import annotations

from typing import AsyncIterator, Protocol


class StoreError(Exception):
    """The store could not be reached or answered nonsense; the request goes on without it."""


class Store(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False) -> bool:
        """Store `value` unless an entry is there already (or replacing it, for a refresh), and
        release `owner`'s fill lock, in one step. True when `value` is what is now stored."""
        ...

    async def try_lock(self, key: str, owner: str, lease_ms: int) -> bool: ...

    async def renew(self, key: str, owner: str, lease_ms: int) -> bool: ...

    async def unlock(self, key: str, owner: str) -> None: ...

    def keys(self) -> AsyncIterator[str]:
        """Every stored cache key, in no particular order (for `detgate cache export`)."""
        ...

    async def close(self) -> None: ...
