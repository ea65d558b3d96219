"""Circuit breaker per upstream: stop sending traffic to an upstream that keeps failing.

closed     every call goes through; outcomes are counted in a rolling time window.
           Opens on `consecutive_failures` failures in a row, or when at least `min_calls`
           calls in the window failed at a rate >= `failure_rate`.
open       every call fails fast with CircuitOpen (the handler answers 503) for `open_for`
           seconds.
half_open  up to `half_open_probes` calls at once go through as probes; that many
           successes close the breaker, any failure opens it again.

Async safety comes from never awaiting inside a state change: within one event loop each
method runs to completion, so no lock is needed (and none would help across processes:
each gateway replica keeps its own breakers, like any client-side breaker).
"""
from __future__ import annotations

import enum
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from gateway.upstream.retry import retry_reason

Clock = Callable[[], float]


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    window: float = 10.0  # seconds of history the failure rate is computed over
    buckets: int = 10  # the window slides in steps of window / buckets
    min_calls: int = 20
    failure_rate: float = 0.5
    consecutive_failures: int = 5  # 0 turns this trigger off
    open_for: float = 5.0
    half_open_probes: int = 1

    def __post_init__(self) -> None:
        if self.window <= 0 or self.buckets < 1 or self.open_for < 0:
            raise ValueError("window and buckets must be positive, open_for >= 0")
        if not 0 < self.failure_rate <= 1:
            raise ValueError("failure_rate must be in (0, 1]")
        if self.min_calls < 1 or self.half_open_probes < 1 or self.consecutive_failures < 0:
            raise ValueError("min_calls and half_open_probes must be >= 1")


class CircuitOpen(Exception):
    """Raised instead of calling an upstream whose breaker is open: answer 503.

    Deliberately has no `status` attribute: retry.retry_reason must not mistake it for an
    upstream 5xx and retry into the open breaker.
    """

    http_status = 503
    code = "circuit_open"

    def __init__(self, upstream: str, retry_after: float):
        super().__init__(f"upstream {upstream!r} is failing; circuit open, retry in {retry_after:.1f}s")
        self.upstream = upstream
        self.retry_after = retry_after


@dataclass(frozen=True)
class Permit:
    """Proof that a call was let through; hand it back to `record`."""

    generation: int  # which state period it was issued in; stale permits are ignored
    probe: bool


class _Window:
    """Calls and failures over the last `window` seconds, in `buckets` time slices."""

    def __init__(self, window: float, buckets: int):
        self._width = window / buckets
        self._slices = [[-1, 0, 0] for _ in range(buckets)]  # [slice index, calls, failures]

    def add(self, now: float, failed: bool) -> None:
        index = math.floor(now / self._width)
        s = self._slices[index % len(self._slices)]
        if s[0] != index:
            s[:] = [index, 0, 0]
        s[1] += 1
        s[2] += failed

    def totals(self, now: float) -> tuple[int, int]:
        oldest = math.floor(now / self._width) - len(self._slices)
        live = [s for s in self._slices if s[0] > oldest]
        return sum(s[1] for s in live), sum(s[2] for s in live)


class Breaker:
    def __init__(
        self,
        upstream: str,
        config: BreakerConfig = BreakerConfig(),
        clock: Clock = time.monotonic,
        on_change: Callable[[str, State, State], object] | None = None,
    ):
        self.upstream = upstream
        self.config = config
        self._clock = clock
        self._on_change = on_change
        self._state = State.CLOSED
        self._generation = 0
        self._window = _Window(config.window, config.buckets)
        self._consecutive = 0
        self._opened_at = 0.0
        self._probes_out = 0
        self._probe_successes = 0

    @property
    def state(self) -> State:
        """The current state; an open breaker whose time is up reads as half-open."""
        if self._state is State.OPEN and self._clock() - self._opened_at >= self.config.open_for:
            self._enter(State.HALF_OPEN)
        return self._state

    def allow(self) -> Permit:
        """Let one call through, or raise CircuitOpen."""
        state = self.state
        if state is State.CLOSED:
            return Permit(self._generation, probe=False)
        if state is State.HALF_OPEN and self._probes_out < self.config.half_open_probes:
            self._probes_out += 1
            return Permit(self._generation, probe=True)
        if state is State.OPEN:
            wait = self.config.open_for - (self._clock() - self._opened_at)
        else:  # half-open with every probe slot taken: come back after the probes finish
            wait = self.config.open_for
        raise CircuitOpen(self.upstream, max(0.0, wait))

    def record(self, permit: Permit, failed: bool | None) -> None:
        """Report how a permitted call went: True failed, False succeeded, None no verdict
        (cancelled: frees a probe slot without counting)."""
        if permit.generation != self._generation:
            return
        if permit.probe:
            self._probes_out -= 1
            if failed:
                self._enter(State.OPEN)
            elif failed is False:
                self._probe_successes += 1
                if self._probe_successes >= self.config.half_open_probes:
                    self._enter(State.CLOSED)
            return
        if failed is None:
            return
        now = self._clock()
        self._window.add(now, failed)
        self._consecutive = self._consecutive + 1 if failed else 0
        if failed and self._should_open(now):
            self._enter(State.OPEN)

    @asynccontextmanager
    async def guard(self, verdict: Callable[[BaseException], bool | None] | None = None) -> AsyncIterator[None]:
        """`async with breaker.guard(): await call()` — allow, run, record.

        `verdict(exc)` says what an error means for the upstream's health: True a failure,
        False a success, None unknown. By default (`upstream_verdict`), trouble that
        retrying could cure (connection, timeout, 429, 5xx) is a failure, any other HTTP
        answer (a 400 is still an answer) a success, and an error raised on our side of
        the wire no verdict. A returned call is a success; a cancelled one has no verdict.
        """
        judge = verdict or upstream_verdict
        permit = self.allow()
        try:
            yield
        except Exception as exc:
            self.record(permit, judge(exc))
            raise
        except BaseException:
            self.record(permit, None)
            raise
        self.record(permit, False)

    def _should_open(self, now: float) -> bool:
        c = self.config
        if c.consecutive_failures and self._consecutive >= c.consecutive_failures:
            return True
        calls, failures = self._window.totals(now)
        return calls >= c.min_calls and failures >= c.failure_rate * calls

    def _enter(self, new: State) -> None:
        old, self._state = self._state, new
        self._generation += 1
        self._probes_out = 0
        self._probe_successes = 0
        if new is State.OPEN:
            self._opened_at = self._clock()
        if new is State.CLOSED:
            self._window = _Window(self.config.window, self.config.buckets)
            self._consecutive = 0
        if self._on_change is not None:
            self._on_change(self.upstream, old, new)


def upstream_verdict(exc: BaseException) -> bool | None:
    if retry_reason(exc) is not None:
        return True
    return False if isinstance(getattr(exc, "status", None), int) else None


class Breakers:
    """One breaker per upstream name, made on first use, all with the same config."""

    def __init__(
        self,
        config: BreakerConfig = BreakerConfig(),
        clock: Clock = time.monotonic,
        on_change: Callable[[str, State, State], object] | None = None,
    ):
        self._config = config
        self._clock = clock
        self._on_change = on_change
        self._by_upstream: dict[str, Breaker] = {}

    def __getitem__(self, upstream: str) -> Breaker:
        breaker = self._by_upstream.get(upstream)
        if breaker is None:
            breaker = Breaker(upstream, self._config, self._clock, self._on_change)
            self._by_upstream[upstream] = breaker
        return breaker

    def states(self) -> dict[str, State]:
        """The state of each upstream's breaker made so far (the gauge itself follows on_change)."""
        return {name: b.state for name, b in self._by_upstream.items()}
