"""Retrying upstream calls: exponential backoff with full jitter, bounded by a deadline.

What is retried: connection failures, timeouts, broken bodies, 429 and 5xx. Any other
status is the request's own fault and goes back to the client at once. A `Retry-After`
(or OpenAI's `retry-after-ms`) from the upstream is honoured: we never come back sooner
than asked, and when the wait it asks for does not fit the deadline or the policy's cap we
give up instead of retrying early.

`fn` must cover the call only up to the point where bytes reach the client (for a stream:
until the response headers and status are known); a stream that breaks after chunks were
forwarded cannot be retried transparently, and that is the caller's business.
"""
from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Generic, Mapping, TypeVar

import aiohttp

from gateway.upstream.deadline import Deadline

T = TypeVar("T")

# Label values of detgate_upstream_retries_total{reason}: a small closed set on purpose.
REASONS = ("connect", "disconnect", "timeout", "broken", "429", "5xx")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    base_delay: float = 0.1  # seconds; the ceiling of attempt n's jitter is base * 2**(n-1)
    max_delay: float = 5.0  # cap on that ceiling
    max_retry_after: float = 30.0  # a longer Retry-After means "give up", not "wait"

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ValueError("delays must be >= 0")


@dataclass(frozen=True)
class Attempt:
    number: int  # 1-based
    outcome: str  # "ok", one of REASONS (retryable failure), or "fatal"
    delay: float  # seconds slept after this attempt before the next one


@dataclass(frozen=True)
class Success(Generic[T]):
    value: T
    attempts: tuple[Attempt, ...]


class GaveUp(Exception):
    """The call failed for good. `last` is the upstream's own error, to pass on unchanged.

    why: "fatal" (not retryable), "max_attempts", "deadline", or "retry_after" (the
    upstream asked for a longer wait than the policy allows).
    """

    def __init__(self, last: BaseException, attempts: tuple[Attempt, ...], why: str):
        super().__init__(f"upstream call failed after {len(attempts)} attempt(s) ({why}): {last!r}")
        self.last = last
        self.attempts = attempts
        self.why = why

    @property
    def http_status(self) -> int:
        """The status to answer with: the upstream's own; the gateway's own for its errors
        (CircuitOpen 503, Saturated 429); else 504 for a timeout and 502 for the rest."""
        for name in ("status", "http_status"):
            status = getattr(self.last, name, None)
            if isinstance(status, int):
                return status
        return 504 if isinstance(self.last, TimeoutError) else 502


def retry_reason(exc: BaseException) -> str | None:
    """The retry reason for a failed attempt, or None when retrying cannot help.

    HTTP errors are recognised by duck typing: an exception with an int `status` (as
    aiohttp.ClientResponseError has, and the gateway's own upstream error should).
    """
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        if status == 429:
            return "429"
        return "5xx" if 500 <= status <= 599 else None
    # ServerTimeoutError is also a connection error: test for timeouts first.
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
        return "connect"
    if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError)):
        return "disconnect"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "broken"
    return None


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is not None:
        return value
    # A plain dict is case-sensitive; aiohttp's CIMultiDict is not.
    lower = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lower), None)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds or an HTTP-date.

    `now` is wall-clock epoch seconds (an HTTP-date is absolute). Unparseable -> None,
    a date in the past -> 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if seconds >= 0 and seconds != float("inf") else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate gives naive for "-0000"
        return None
    return max(0.0, when.timestamp() - now)


def requested_wait(exc: BaseException, now: float) -> float | None:
    """The wait an upstream error asks for, from retry-after-ms or Retry-After."""
    headers = getattr(exc, "headers", None)
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        try:
            if float(ms) >= 0:
                return float(ms) / 1000.0
        except ValueError:
            pass
    return parse_retry_after(_header(headers, "retry-after"), now)


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max_delay, base * 2**(attempt-1))]."""
    ceiling = min(policy.max_delay, policy.base_delay * 2 ** (attempt - 1))
    return rng.uniform(0.0, ceiling)


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    deadline: Deadline,
    *,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    wall_clock: Callable[[], float] = time.time,
    on_retry: Callable[[str, float], object] | None = None,
) -> Success[T]:
    """Run `fn` until it succeeds, fails for good, runs out of attempts or of deadline.

    Each attempt runs under a timeout equal to what is left of `deadline`, and no backoff
    sleep is started that would end past it. `on_retry(reason, delay)` is called once per
    retry, before sleeping (for detgate_upstream_retries_total{upstream,reason}).
    Raises GaveUp with the last error; cancellation is never swallowed.
    """
    rng = rng if rng is not None else random.Random()
    attempts: list[Attempt] = []
    number = 0
    while True:
        number += 1
        if deadline.expired():
            last: BaseException = TimeoutError("deadline passed before the upstream call")
            raise GaveUp(last, tuple(attempts), "deadline")
        try:
            async with asyncio.timeout(deadline.remaining()):
                value = await fn()
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised inside GaveUp
            reason = retry_reason(exc)
            why, delay = _give_up_or_wait(exc, reason, number, policy, deadline, rng, wall_clock)
            attempts.append(Attempt(number, reason or "fatal", delay))
            if why is not None:
                raise GaveUp(exc, tuple(attempts), why) from exc
            if on_retry is not None:
                on_retry(reason, delay)
            await sleep(delay)
        else:
            attempts.append(Attempt(number, "ok", 0.0))
            return Success(value, tuple(attempts))


def _give_up_or_wait(exc: BaseException, reason: str | None, number: int, policy: RetryPolicy, deadline: Deadline,
                     rng: random.Random, wall_clock: Callable[[], float]) -> tuple[str | None, float]:
    """After failed attempt `number`: (GaveUp's why, 0) to stop, or (None, the delay) to retry."""
    if reason is None:
        return "fatal", 0.0
    if deadline.expired():
        return "deadline", 0.0
    if number == policy.max_attempts:
        return "max_attempts", 0.0
    asked = requested_wait(exc, wall_clock())
    if asked is not None and asked > policy.max_retry_after:
        return "retry_after", 0.0
    delay = asked if asked is not None else backoff(policy, number, rng)
    if not deadline.allows(delay):
        return "deadline", 0.0
    return None, delay
