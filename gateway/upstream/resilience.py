"""What stands between the gateway and a struggling upstream: a slot cap, a circuit
breaker and retries, per upstream, all bounded by the call's deadline.

One attempt runs inside `guard(upstream, deadline)`: it first takes a concurrency slot
(Saturated when none frees up in time), then a breaker permit (CircuitOpen when the
upstream keeps failing). Retries wrap attempts from outside, so a retry takes a fresh
slot and a fresh permit, and an open circuit or a full queue is never retried into.
Whatever finally fails leaves as an UpstreamError, the one error type handlers know.
"""
from __future__ import annotations

import random
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from gateway.config import Settings
from gateway.errors import UpstreamError
from gateway.ingress.ratelimit import retry_after_header
from gateway.ops.metrics import Metrics
from gateway.upstream.breaker import BreakerConfig, Breakers, CircuitOpen, State
from gateway.upstream.concurrency import Saturated, UpstreamSlots
from gateway.upstream.deadline import Deadline
from gateway.upstream.retry import GaveUp, RetryPolicy, call_with_retries

T = TypeVar("T")


@dataclass(frozen=True)
class Timeouts:
    total: float  # a whole answer's call, or a stream until its first event; retries and backoff included
    connect: float
    idle: float  # a stream's silence allowed before its first byte and between chunks


class Resilience:
    def __init__(self, settings: Settings, metrics: Metrics, rng: random.Random | None = None) -> None:
        self.metrics = metrics
        self.timeouts = Timeouts(settings.upstream_timeout_s, settings.upstream_connect_timeout_s,
                                 settings.upstream_idle_timeout_s)
        self.policy = RetryPolicy(max_attempts=settings.upstream_max_attempts)
        self.breakers = Breakers(BreakerConfig(consecutive_failures=settings.breaker_failures,
                                               open_for=settings.breaker_open_s), on_change=self._circuit_changed)
        self._slot_settings = (settings.upstream_concurrency, settings.upstream_queue, settings.upstream_queue_timeout_s)
        self._slots: dict[str, UpstreamSlots] = {}
        self._rng = rng or random.Random()

    def deadline(self) -> Deadline:
        return Deadline.after(self.timeouts.total)

    def slots(self, upstream: str) -> UpstreamSlots:
        slots = self._slots.get(upstream)
        if slots is None:
            slots = self._slots[upstream] = UpstreamSlots(upstream, *self._slot_settings)
        return slots

    @asynccontextmanager
    async def guard(self, upstream: str, deadline: Deadline) -> AsyncIterator[None]:
        """One attempt's slot and breaker permit, held for the body of the `async with`."""
        try:
            async with self.slots(upstream).slot(deadline):
                async with self.breakers[upstream].guard():
                    yield
        except Saturated as exc:
            self.metrics.upstream_saturated.labels(upstream, exc.why).inc()
            raise

    async def call(self, upstream: str, attempt: Callable[[], Awaitable[T]], deadline: Deadline) -> T:
        """`attempt()` until it succeeds or retrying is over; raises UpstreamError."""
        retries = self.metrics.upstream_retries

        def counted(reason: str, delay: float) -> None:
            retries.labels(upstream, reason).inc()

        try:
            return (await call_with_retries(attempt, self.policy, deadline, rng=self._rng, on_retry=counted)).value
        except GaveUp as exc:
            raise as_upstream_error(upstream, exc) from exc

    def _circuit_changed(self, upstream: str, old: State, new: State) -> None:
        self.metrics.circuit_open.labels(upstream).set(1 if new is State.OPEN else 0)


def as_upstream_error(upstream: str, exc: GaveUp) -> UpstreamError:
    """The error a client gets when an upstream call failed for good: the upstream's own
    error as it came, or one the gateway words."""
    last = exc.last
    if isinstance(last, UpstreamError):
        return last
    if isinstance(last, (CircuitOpen, Saturated)):
        kind = "rate_limit_error" if isinstance(last, Saturated) else "upstream_error"
        return UpstreamError(last.http_status, headers={"retry-after": retry_after_header(last.retry_after)},
                             message=str(last), type=kind, code=last.code)
    attempts = f"after {len(exc.attempts)} attempt(s)"
    if isinstance(last, TimeoutError):
        why = "no answer within the call's deadline" if exc.why == "deadline" else "timed out"
        return UpstreamError.unreachable(upstream, f"{why} {attempts}", repr(last), status=504)
    return UpstreamError.unreachable(upstream, f"the connection failed {attempts}", repr(last))
