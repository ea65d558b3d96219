"""How the engine thread hands events to the HTTP side's event loops.

A step's events are held until the next step's work is queued on the GPU (ModelRunner.step
calls send): the handlers' work on them (detokenizing, writing the streams) then shares the
GIL with the engine's wait for the GPU, not with the scheduling and staging that the GPU
waits for. And the engine stays at most one lot ahead of the handlers: before sending a lot
it waits until the loops have run the handlers that the previous lot woke. Without that, at
256 streams the engine outran the handlers, and some streams waited 160 ms between chunks
while others were served (bench/results/backend_handoff_ab.md). A stalled loop holds the
engine back for at most STALL_SECONDS a lot.
"""
from __future__ import annotations

import asyncio
import collections
import threading

STALL_SECONDS = 0.05


class Outbox:
    def __init__(self, stall_seconds: float = STALL_SECONDS):
        self._held: dict[asyncio.AbstractEventLoop, list] = collections.defaultdict(list)
        self._unread = 0   # lots sent whose handlers have not run yet
        self._read = threading.Condition()
        self._stall_seconds = stall_seconds

    def put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, event) -> None:
        self._held[loop].append((queue, event))

    def send(self) -> None:
        """Hand everything held to its loop, in order, once the last lot was read (or the wait ran out)."""
        if not self._held:
            return
        with self._read:
            self._read.wait_for(lambda: self._unread == 0, timeout=self._stall_seconds)
            self._unread += len(self._held)
        for loop, items in self._held.items():
            loop.call_soon_threadsafe(_put_all, items, self._was_read)
        self._held.clear()

    def _was_read(self) -> None:
        with self._read:
            self._unread -= 1
            self._read.notify()


def _put_all(items, was_read) -> None:
    for queue, event in items:
        queue.put_nowait(event)
    # Behind the handlers these puts woke, each of which runs until it waits for its next event.
    asyncio.get_running_loop().call_soon(was_read)
