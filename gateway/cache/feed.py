"""A live, replayable sequence of stream events that any number of readers follow.

The upstream call pushes events as they arrive; each streaming request that shares the
call reads them from the first one on, at its own pace, without holding the producer up.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator


class Feed:
    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.closed = False
        # What the stream's first events said of the answer, for the live response's headers.
        self.model = ""
        self.fingerprint: str | None = None
        self._wake = asyncio.Event()

    def push(self, data: bytes) -> None:
        self.events.append(data)
        self._notify()

    def close(self) -> None:
        self.closed = True
        self._notify()

    def _notify(self) -> None:
        # A fresh Event per change: readers that woke up never see a stale "set".
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def started(self) -> None:
        """Until the first event arrives or the feed closes without one."""
        while not self.events and not self.closed:
            await self._wake.wait()

    async def follow(self) -> AsyncIterator[bytes]:
        seen = 0
        while True:
            while seen < len(self.events):
                seen += 1
                yield self.events[seen - 1]
            if self.closed:
                return
            await self._wake.wait()
