"""A cap on concurrent calls to one upstream, with a short, bounded queue in front of it.

Past the cap, requests wait in FIFO order, but only `max_queue` of them and only for
`queue_timeout` seconds (or what is left of their deadline, if less): a queue that grows
without bound turns an overloaded upstream into timeouts for everyone. A request that
cannot get a slot gets Saturated, which the handler answers with a 429 and Retry-After.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

from gateway.upstream.deadline import Deadline


class Saturated(Exception):
    """No upstream slot: why is "queue_full" or "queue_timeout"."""

    http_status = 429
    code = "upstream_saturated"

    def __init__(self, upstream: str, why: str, retry_after: float):
        super().__init__(f"too many concurrent requests to upstream {upstream!r} ({why})")
        self.upstream = upstream
        self.why = why
        self.retry_after = retry_after


class UpstreamSlots:
    def __init__(self, upstream: str, limit: int, max_queue: int = 0, queue_timeout: float = 1.0):
        if limit < 1 or max_queue < 0 or queue_timeout < 0:
            raise ValueError("limit must be >= 1, max_queue and queue_timeout >= 0")
        self.upstream = upstream
        self.limit = limit
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self._sem = asyncio.Semaphore(limit)
        self._in_use = 0
        self._waiting = 0

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        return self._waiting

    @asynccontextmanager
    async def slot(self, deadline: Deadline | None = None) -> AsyncIterator[None]:
        """Hold one slot for the body of the `async with`."""
        await self._acquire(deadline)
        self._in_use += 1
        try:
            yield
        finally:
            self._in_use -= 1
            self._sem.release()

    async def _acquire(self, deadline: Deadline | None) -> None:
        if not self._sem.locked():
            await self._sem.acquire()  # a free slot: returns without suspending
            return
        if self._waiting >= self.max_queue:
            raise Saturated(self.upstream, "queue_full", self.queue_timeout)
        wait = self.queue_timeout if deadline is None else min(self.queue_timeout, deadline.remaining())
        self._waiting += 1
        try:
            async with asyncio.timeout(wait):
                await self._sem.acquire()
        except TimeoutError:
            raise Saturated(self.upstream, "queue_timeout", self.queue_timeout) from None
        finally:
            self._waiting -= 1
