"""What the gateway needs from a cache store, whichever one is configured.

Entries are written first-writer-wins and never change afterwards (except by an explicit
refresh); one written with a TTL is gone when it runs out. Fill locks carry a lease so
that a dead holder's claim runs out by itself.
"""
from __future__ import annotations

from typing import AsyncIterator, Protocol


class StoreError(Exception):
    """The store could not be reached or answered nonsense; the request goes on without it.

    Its message may reach a client (a fail-closed 503, /detgate/status), so it names the
    operation and the kind of failure only; `detail`, the driver's own words with the
    store's host and port, is for the operator's log.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message

    @classmethod
    def of(cls, what: str, exc: BaseException) -> StoreError:
        return cls(f"{what}: {type(exc).__name__}", f"{what}: {exc}")


class Store(Protocol):
    async def ping(self) -> None:
        """Raises StoreError when the store cannot be used now."""
        ...

    async def get(self, key: str) -> bytes | None: ...

    async def get_expiring(self, key: str) -> tuple[bytes | None, float | None]:
        """The value and the seconds it has left (None: no TTL), for copies that must not
        outlive it."""
        ...

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False, ttl_ms: int = 0) -> bool:
        """Store `value` unless an entry is there already (or replacing it, for a refresh), for
        `ttl_ms` (0: no limit), and release `owner`'s fill lock, in one step. True when
        `value` is what is now stored."""
        ...

    async def try_lock(self, key: str, owner: str, lease_ms: int) -> bool: ...

    async def renew(self, key: str, owner: str, lease_ms: int) -> bool: ...

    async def unlock(self, key: str, owner: str) -> None: ...

    def keys(self) -> AsyncIterator[str]:
        """Every stored cache key, in no particular order (for `detgate cache export`)."""
        ...

    async def scan(self, cursor: str, count: int) -> tuple[list[str], str]:
        """One step of a walk over the stored keys: about `count` of them and the cursor of the
        next step ("" to start, and when the walk is over). Never blocks the store for long."""
        ...

    async def delete_if(self, key: str, mac: bytes) -> bool:
        """Delete the entry under `key` only if its value still starts with `mac` (the seal of
        the entry the caller chose), in one step; True when it was deleted."""
        ...

    async def close(self) -> None: ...
