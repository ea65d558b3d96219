"""Circuit breaker: when it opens, how it fails fast, how it probes its way back."""
import asyncio

import aiohttp
import pytest

from fakes.fault_upstream import FaultUpstream
from fakes.faults import FaultPlan
from gateway.upstream.breaker import Breaker, BreakerConfig, Breakers, CircuitOpen, State
from gateway.upstream.concurrency import UpstreamSlots
from gateway.upstream.deadline import Deadline
from gateway.upstream.retry import GaveUp, RetryPolicy, call_with_retries


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class HTTPError(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


def fail(b, n=1):
    for _ in range(n):
        b.record(b.allow(), True)


def succeed(b, n=1):
    for _ in range(n):
        b.record(b.allow(), False)


def half_open(**config) -> Breaker:
    """A breaker that one failure opened and whose open period has just run out."""
    clock = Clock()
    b = Breaker("up", BreakerConfig(consecutive_failures=1, open_for=1, **config), clock)
    fail(b)
    clock.now += 1
    return b


def test_opens_after_consecutive_failures_and_fails_fast():
    clock = Clock()
    b = Breaker("up", BreakerConfig(consecutive_failures=3, open_for=5), clock)
    fail(b, 2)
    succeed(b)  # a success resets the run
    fail(b, 2)
    assert b.state is State.CLOSED
    fail(b)
    assert b.state is State.OPEN
    clock.now += 2
    with pytest.raises(CircuitOpen) as info:
        b.allow()
    assert info.value.upstream == "up" and info.value.retry_after == pytest.approx(3.0)


def test_half_open_lets_limited_probes_through_and_closes_on_their_success():
    clock = Clock()
    b = Breaker("up", BreakerConfig(consecutive_failures=1, open_for=5, half_open_probes=2), clock)
    fail(b)
    clock.now += 5
    assert b.state is State.HALF_OPEN
    p1, p2 = b.allow(), b.allow()
    assert p1.probe and p2.probe
    with pytest.raises(CircuitOpen):
        b.allow()  # both probe slots taken
    b.record(p1, False)
    assert b.state is State.HALF_OPEN  # needs both probes to succeed
    b.record(p2, False)
    assert b.state is State.CLOSED
    assert not b.allow().probe


def test_a_failed_probe_opens_it_again_for_a_full_period():
    clock = Clock()
    b = Breaker("up", BreakerConfig(consecutive_failures=1, open_for=5), clock)
    fail(b)
    clock.now += 5
    b.record(b.allow(), True)
    assert b.state is State.OPEN
    clock.now += 4.9
    with pytest.raises(CircuitOpen):
        b.allow()
    clock.now += 0.1
    assert b.state is State.HALF_OPEN


def test_failure_rate_over_the_window_needs_min_calls():
    clock = Clock()
    cfg = BreakerConfig(consecutive_failures=0, min_calls=10, failure_rate=0.5, window=10, buckets=10)
    b = Breaker("up", cfg, clock)
    for _ in range(4):
        fail(b)
        succeed(b)
    assert b.state is State.CLOSED  # 50% but only 8 calls
    succeed(b)
    fail(b)
    assert b.state is State.OPEN  # 5 of 10


def test_old_outcomes_slide_out_of_the_window():
    clock = Clock()
    cfg = BreakerConfig(consecutive_failures=0, min_calls=4, failure_rate=0.5, window=10, buckets=10)
    b = Breaker("up", cfg, clock)
    fail(b, 3)
    assert b.state is State.CLOSED  # 3 calls < min_calls
    clock.now += 11  # those failures are history now
    succeed(b, 3)
    fail(b, 2)
    assert b.state is State.CLOSED  # 2 of 5 in the window; the 3 old failures do not count
    fail(b)
    assert b.state is State.OPEN  # 3 of 6


def test_a_permit_from_an_earlier_period_does_not_count():
    clock = Clock()
    b = Breaker("up", BreakerConfig(consecutive_failures=2, open_for=1), clock)
    slow = b.allow()  # issued while closed, finishes after the breaker moved on
    fail(b, 2)
    clock.now += 1
    probe = b.allow()
    b.record(slow, False)  # must not count as the probe's success
    assert b.state is State.HALF_OPEN
    b.record(probe, False)
    assert b.state is State.CLOSED


async def test_guard_counts_upstream_failures_but_not_client_errors():
    b = Breaker("up", BreakerConfig(consecutive_failures=2))
    for _ in range(3):
        with pytest.raises(HTTPError):
            async with b.guard():
                raise HTTPError(400)  # the request was bad; the upstream is fine
    assert b.state is State.CLOSED
    for _ in range(2):
        with pytest.raises(HTTPError):
            async with b.guard():
                raise HTTPError(503)
    assert b.state is State.OPEN
    with pytest.raises(CircuitOpen):
        async with b.guard():
            pytest.fail("an open breaker must not run the call")


async def test_half_open_admits_exactly_the_probe_limit_under_concurrency():
    b = half_open(half_open_probes=2)
    gate = asyncio.Event()
    ran = []

    async def call():
        async with b.guard():
            ran.append(1)
            await gate.wait()

    tasks = [asyncio.ensure_future(call()) for _ in range(20)]
    await asyncio.sleep(0.01)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert len(ran) == 2
    assert sum(isinstance(r, CircuitOpen) for r in results) == 18
    assert b.state is State.CLOSED


async def test_an_error_on_our_side_of_the_wire_is_no_verdict_on_the_upstream():
    b = half_open()
    with pytest.raises(ValueError):
        async with b.guard():
            raise ValueError("a bug, or a full queue: the upstream was never asked")
    assert b.state is State.HALF_OPEN  # neither closed by a fake success nor reopened
    async with b.guard():
        pass
    assert b.state is State.CLOSED


async def test_a_cancelled_probe_frees_its_slot_without_a_verdict():
    b = half_open()

    async def probe():
        async with b.guard():
            await asyncio.sleep(10)

    task = asyncio.ensure_future(probe())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.state is State.HALF_OPEN
    assert b.allow().probe  # the slot is free again


def test_breakers_per_upstream_report_changes_for_the_gauge():
    clock = Clock()
    changes = []
    board = Breakers(BreakerConfig(consecutive_failures=1, open_for=2), clock,
                     on_change=lambda name, old, new: changes.append((name, old.value, new.value)))
    assert board["a"] is board["a"]
    fail(board["a"])
    succeed(board["b"])
    assert board.states() == {"a": State.OPEN, "b": State.CLOSED}
    clock.now += 2
    succeed(board["a"])
    assert changes == [("a", "closed", "open"), ("a", "open", "half_open"), ("a", "half_open", "closed")]


def test_config_rejects_nonsense():
    for bad in (dict(window=0), dict(failure_rate=0), dict(failure_rate=1.5), dict(half_open_probes=0),
                dict(min_calls=0), dict(consecutive_failures=-1)):
        with pytest.raises(ValueError):
            BreakerConfig(**bad)


async def test_composed_with_retries_and_slots_against_a_failing_upstream():
    """The intended wiring: a slot, then the breaker, around each attempt of the retry loop."""
    up = FaultUpstream(FaultPlan(weights={"500": 1}), seed=11)
    breaker = Breaker("up", BreakerConfig(consecutive_failures=3, open_for=0.3))
    slots = UpstreamSlots("up", limit=4, max_queue=8)
    policy = RetryPolicy(max_attempts=5, base_delay=0.001)

    async with up, aiohttp.ClientSession(raise_for_status=True) as http:
        async def attempt():
            async with slots.slot(), breaker.guard():
                async with http.post(f"{up.url}/completions", json={"model": "m", "prompt": "p"}) as r:
                    return await r.json()

        async def request():
            return await call_with_retries(attempt, policy, Deadline.after(5))

        with pytest.raises(GaveUp) as info:
            await request()
        assert [a.outcome for a in info.value.attempts] == ["5xx", "5xx", "5xx", "fatal"]
        assert isinstance(info.value.last, CircuitOpen) and info.value.http_status == 503
        calls = sum(up.served.values())
        with pytest.raises(GaveUp):
            await request()  # fails fast: the open breaker spares the upstream
        assert sum(up.served.values()) == calls == 3

        up.plan.weights = {"ok": 1}  # the upstream recovers
        await asyncio.sleep(0.3)
        result = await request()
        assert [a.outcome for a in result.attempts] == ["ok"] and breaker.state is State.CLOSED
