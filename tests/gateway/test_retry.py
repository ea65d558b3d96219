"""Retry policy: what is retried, how long it waits, and that the deadline always wins."""
import asyncio
import email.utils
import random
import time

import aiohttp
import pytest

from gateway.upstream.deadline import Deadline
from gateway.upstream.retry import (REASONS, GaveUp, RetryPolicy, backoff, call_with_retries, parse_retry_after,
                           requested_wait, retry_reason)
from fakes.fault_upstream import FaultUpstream
from fakes.faults import FaultPlan


class HTTPError(Exception):
    def __init__(self, status, headers=None):
        super().__init__(status)
        self.status = status
        self.headers = headers or {}


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def clock(self):
        return self.now

    async def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def script(*outcomes):
    """An upstream call that fails or succeeds in the given order."""
    it = iter(outcomes)

    async def fn():
        outcome = next(it)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return fn


NOW = 1_800_000_000.0


@pytest.mark.parametrize("value, expected", [
    ("3", 3.0), (" 1.5 ", 1.5), ("0", 0.0),
    (email.utils.formatdate(NOW + 10, usegmt=True), 10.0),
    (email.utils.formatdate(NOW - 60, usegmt=True), 0.0),
    ("-1", None), ("soon", None), ("", None), (None, None), ("inf", None),
])
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, NOW) == expected


def test_retry_after_ms_wins_and_header_names_are_case_insensitive():
    assert requested_wait(HTTPError(429, {"Retry-After-Ms": "250", "Retry-After": "9"}), NOW) == 0.25
    assert requested_wait(HTTPError(429, {"RETRY-AFTER": "4"}), NOW) == 4.0
    assert requested_wait(HTTPError(429), NOW) is None
    assert requested_wait(ValueError(), NOW) is None


@pytest.mark.parametrize("exc, reason", [
    (HTTPError(429), "429"), (HTTPError(500), "5xx"), (HTTPError(503), "5xx"), (HTTPError(599), "5xx"),
    (HTTPError(400), None), (HTTPError(401), None), (HTTPError(404), None), (HTTPError(422), None),
    (TimeoutError(), "timeout"), (asyncio.TimeoutError(), "timeout"),
    (aiohttp.ServerTimeoutError(), "timeout"),
    (ConnectionRefusedError(), "connect"),
    (aiohttp.ServerDisconnectedError(), "disconnect"), (ConnectionResetError(), "disconnect"),
    (aiohttp.ClientPayloadError("short body"), "broken"),
    (ValueError("bug"), None), (KeyError("x"), None),
])
def test_retry_reason(exc, reason):
    assert retry_reason(exc) == reason
    assert reason is None or reason in REASONS  # the metric's label values are a closed set


def test_backoff_is_full_jitter_under_a_capped_exponential_ceiling():
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    rng = random.Random(7)
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        draws = [backoff(policy, attempt, rng) for _ in range(500)]
        assert 0 <= min(draws) and max(draws) <= ceiling
        assert max(draws) > 0.9 * ceiling and min(draws) < 0.1 * ceiling  # spread over the range
    assert [backoff(policy, 3, random.Random(1)) for _ in range(3)] == \
           [backoff(policy, 3, random.Random(1)) for _ in range(3)]


async def test_retries_until_success_and_reports_each_attempt():
    t = FakeTime()
    retries = []
    fn = script(HTTPError(503), HTTPError(429, {"Retry-After": "2"}), ConnectionRefusedError(), "answer")
    result = await call_with_retries(fn, RetryPolicy(max_attempts=5), Deadline.after(60, t.clock),
                                     rng=random.Random(3), sleep=t.sleep, wall_clock=lambda: NOW,
                                     on_retry=lambda reason, delay: retries.append((reason, delay)))
    assert result.value == "answer"
    assert [a.outcome for a in result.attempts] == ["5xx", "429", "connect", "ok"]
    assert [r for r, _ in retries] == ["5xx", "429", "connect"]
    assert t.slept == [d for _, d in retries]
    assert t.slept[1] == 2.0  # Retry-After honoured exactly, not jittered
    assert 0 <= t.slept[0] <= 0.1 and 0 <= t.slept[2] <= 0.4


async def test_client_errors_are_not_retried_and_the_upstream_error_is_kept():
    t = FakeTime()
    error = HTTPError(400)
    with pytest.raises(GaveUp) as info:
        await call_with_retries(script(error, "never"), RetryPolicy(), Deadline.after(60, t.clock), sleep=t.sleep)
    assert info.value.why == "fatal" and info.value.last is error
    assert [a.outcome for a in info.value.attempts] == ["fatal"] and t.slept == []


async def test_gives_up_after_max_attempts():
    t = FakeTime()
    with pytest.raises(GaveUp) as info:
        await call_with_retries(script(*[HTTPError(500)] * 3), RetryPolicy(max_attempts=3),
                                Deadline.after(60, t.clock), sleep=t.sleep)
    assert info.value.why == "max_attempts" and len(info.value.attempts) == 3 and len(t.slept) == 2


async def test_never_sleeps_past_the_deadline():
    t = FakeTime()
    with pytest.raises(GaveUp) as info:
        await call_with_retries(script(HTTPError(429, {"Retry-After": "5"}), "late"), RetryPolicy(),
                                Deadline.after(3, t.clock), sleep=t.sleep)
    assert info.value.why == "deadline" and t.slept == []  # gave up at once rather than wait in vain


async def test_retry_after_beyond_the_policy_cap_gives_up():
    t = FakeTime()
    with pytest.raises(GaveUp) as info:
        await call_with_retries(script(HTTPError(503, {"Retry-After": "120"}), "late"),
                                RetryPolicy(max_retry_after=30), Deadline.after(600, t.clock), sleep=t.sleep)
    assert info.value.why == "retry_after" and t.slept == []


async def test_a_hanging_attempt_is_cut_at_the_deadline():
    async def hang():
        await asyncio.sleep(10)

    start = time.monotonic()
    with pytest.raises(GaveUp) as info:
        await call_with_retries(hang, RetryPolicy(), Deadline.after(0.2))
    assert info.value.why == "deadline" and isinstance(info.value.last, TimeoutError)
    assert 0.19 <= time.monotonic() - start < 1.0


async def test_an_expired_deadline_makes_no_call():
    calls = []

    async def fn():
        calls.append(1)

    with pytest.raises(GaveUp) as info:
        await call_with_retries(fn, RetryPolicy(), Deadline.after(-1))
    assert info.value.why == "deadline" and calls == [] and info.value.attempts == ()


async def test_cancellation_is_not_swallowed():
    async def hang():
        await asyncio.sleep(10)

    task = asyncio.ensure_future(call_with_retries(hang, RetryPolicy(), Deadline.after(30)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("fmt", ["seconds", "date"])
async def test_against_a_faulty_upstream_over_http(fmt):
    upstream = FaultUpstream(FaultPlan(retry_after=1, retry_after_format=fmt), seed=1)
    upstream.script.extend(["429", "500", "reset", "broken"])
    slept = []

    async def fake_sleep(seconds):
        slept.append(seconds)

    async with upstream, aiohttp.ClientSession(raise_for_status=True) as http:
        async def call():
            async with http.post(f"{upstream.url}/chat/completions",
                                 json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}) as r:
                return await r.json()

        result = await call_with_retries(call, RetryPolicy(max_attempts=6), Deadline.after(30),
                                         rng=random.Random(0), sleep=fake_sleep)
    assert [a.outcome for a in result.attempts] == ["429", "5xx", "disconnect", "broken", "ok"]
    assert result.value["choices"][0]["message"]["content"]
    # An HTTP-date has whole seconds only: what is left of "1 s from now" is in [0, 1].
    assert slept[0] == 1.0 if fmt == "seconds" else 0.0 <= slept[0] <= 1.0


async def test_refused_connections_are_retried_until_the_upstream_listens_again():
    upstream = await FaultUpstream(seed=2).start()
    await upstream.refuse()
    reopened = []

    async def sleep_then_reopen(seconds):
        if not reopened:
            reopened.append(seconds)
            await upstream.accept()

    try:
        async with aiohttp.ClientSession(raise_for_status=True) as http:
            async def call():
                async with http.post(f"{upstream.url}/completions", json={"model": "m", "prompt": "p"}) as r:
                    return await r.json()

            result = await call_with_retries(call, RetryPolicy(), Deadline.after(10), sleep=sleep_then_reopen)
    finally:
        await upstream.stop()
    assert [a.outcome for a in result.attempts] == ["connect", "ok"]
    assert result.value["choices"][0]["text"]


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=-1)


@pytest.mark.parametrize("last, status", [(HTTPError(429), 429), (HTTPError(503), 503), (HTTPError(400), 400),
                                          (TimeoutError(), 504), (ConnectionRefusedError(), 502),
                                          (aiohttp.ClientPayloadError("x"), 502)])
def test_gave_up_answers_with_the_upstream_status_or_a_gateway_error(last, status):
    assert GaveUp(last, (), "fatal").http_status == status


def test_errors_raised_by_the_gateway_itself_are_never_retried_and_keep_their_status():
    from gateway.upstream.breaker import CircuitOpen
    from gateway.upstream.concurrency import Saturated
    for exc, status in [(CircuitOpen("up", 1.0), 503), (Saturated("up", "queue_full", 1.0), 429)]:
        assert retry_reason(exc) is None
        assert GaveUp(exc, (), "fatal").http_status == status
