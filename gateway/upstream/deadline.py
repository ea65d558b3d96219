"""A request's deadline: one absolute point in time that every wait is measured against.

Each stage (queueing for an upstream slot, each retry attempt, each backoff sleep) asks
the same Deadline how long it may take, so the stages together can never overrun the
budget the request started with.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import aiohttp

Clock = Callable[[], float]


@dataclass(frozen=True)
class Deadline:
    """An absolute instant on `clock` (time.monotonic by default, the clock asyncio uses)."""

    at: float
    clock: Clock = field(default=time.monotonic, compare=False, repr=False)

    @classmethod
    def after(cls, seconds: float, clock: Clock = time.monotonic) -> Deadline:
        return cls(clock() + seconds, clock)

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - self.clock())

    def expired(self) -> bool:
        return self.clock() >= self.at

    def allows(self, seconds: float) -> bool:
        """True when waiting `seconds` more still ends before the deadline."""
        return self.clock() + seconds < self.at


def client_timeout(deadline: Deadline, connect: float, idle: float, stream: bool = False) -> aiohttp.ClientTimeout:
    """The aiohttp timeouts for one upstream request; connecting may take `connect`.

    A whole answer must arrive by the deadline. It has no idle limit: a non-streamed upstream
    is silent by design until it is done, so a limit on its silence would bound the whole
    generation. A stream may go silent for `idle` (before its first byte or between two
    chunks) and has no total limit: the deadline bounds its start (queueing, retries, the
    first event: Resilience.call), never a stream that keeps making progress.
    """
    left = deadline.remaining()
    if stream:
        return aiohttp.ClientTimeout(total=None, sock_connect=min(connect, left), sock_read=idle)
    return aiohttp.ClientTimeout(total=left, sock_connect=min(connect, left))
