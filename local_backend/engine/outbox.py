"""How the engine hands its output to the HTTP side: in lots, one per step.

A step's events are held until the next step's work is queued on the GPU (ModelRunner.step
calls send): handing them over (to the event loop's thread, or pickling them into the pipe
to the server's process) then overlaps the GPU's work, not the scheduling and staging that
the GPU waits for. And the engine stays at most one lot ahead of the handlers: before
sending a lot it waits until the receiver says the handlers that the previous lot woke have
run. Without that, at 256 streams the engine outran the handlers, and some streams waited
160 ms between chunks while others were served (bench/results/backend_handoff_ab.md). A
stalled receiver holds the engine back for at most STALL_SECONDS a lot.

The receiver is the server's event loop when the engine is one of its threads
(engine_thread.py), or a pipe to it when the engine is a process of its own (engine_process.py).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from local_backend.engine.messages import Lot

STALL_SECONDS = 0.05


class Outbox:
    def __init__(self, stall_seconds: float = STALL_SECONDS):
        self.lot = Lot()
        self._deliver: Callable[[Lot], None] | None = None
        self._unread = 0   # lots sent that the receiver has not read yet
        self._read = threading.Condition()
        self._stall_seconds = stall_seconds
        self.waited = 0.0   # seconds spent waiting for the receiver, in all

    def connect(self, deliver: Callable[[Lot], None]) -> None:
        """Lots go to `deliver` from now on; until then (an engine driven directly) they are dropped."""
        with self._read:
            self._deliver, self._unread = deliver, 0

    def send(self) -> None:
        """Hand what is held over once the last lot was read (or the wait ran out)."""
        lot, self.lot = self.lot, Lot()
        if not lot or self._deliver is None:
            return
        with self._read:
            start = time.perf_counter()
            self._read.wait_for(lambda: self._unread == 0, timeout=self._stall_seconds)
            self.waited += time.perf_counter() - start
            self._unread += 1
        self._deliver(lot)

    def was_read(self) -> None:
        with self._read:
            self._unread = max(0, self._unread - 1)   # an answer to a lot sent before connect
            self._read.notify()
