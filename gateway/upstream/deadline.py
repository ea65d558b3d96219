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


def client_timeout(deadline: Deadline, connect: float, idle: float) -> aiohttp.ClientTimeout:
    """The aiohttp timeouts for one upstream request: connecting may take `connect`, the
    upstream may go silent (before the first byte, or between two stream chunks) for
    `idle`, and the whole request, body included, must end by the deadline.

    A stalled stream thus fails after `idle`, not when the deadline finally runs out.
    """
    left = deadline.remaining()
    return aiohttp.ClientTimeout(total=left, sock_connect=min(connect, left), sock_read=min(idle, left))
