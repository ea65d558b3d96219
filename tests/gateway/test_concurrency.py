"""Per-upstream concurrency cap with a bounded, time-limited queue (real time, short)."""
import asyncio
import time

import pytest

from gateway.upstream.concurrency import Saturated, UpstreamSlots
from gateway.upstream.deadline import Deadline


async def hold(slots, started, release):
    async with slots.slot():
        started.append(1)
        await release.wait()


async def test_waiters_get_a_slot_when_one_frees_up():
    slots = UpstreamSlots("up", limit=2, max_queue=1, queue_timeout=5)
    started, release = [], asyncio.Event()
    holders = [asyncio.ensure_future(hold(slots, started, release)) for _ in range(2)]
    await asyncio.sleep(0.01)
    waiter = asyncio.ensure_future(hold(slots, started, asyncio.Event()))
    await asyncio.sleep(0.01)
    assert (slots.in_use, slots.waiting, len(started)) == (2, 1, 2)
    release.set()
    await asyncio.gather(*holders)
    await asyncio.sleep(0.01)
    assert (slots.in_use, slots.waiting, len(started)) == (1, 0, 3)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.in_use == 0


async def test_a_full_queue_refuses_at_once():
    slots = UpstreamSlots("up", limit=1, max_queue=0, queue_timeout=5)
    release = asyncio.Event()
    holder = asyncio.ensure_future(hold(slots, [], release))
    await asyncio.sleep(0.01)
    start = time.monotonic()
    with pytest.raises(Saturated) as info:
        async with slots.slot():
            pass
    assert info.value.why == "queue_full" and time.monotonic() - start < 0.05
    release.set()
    await holder


@pytest.mark.parametrize("queue_timeout, deadline, waited", [(0.1, None, 0.1), (5.0, 0.1, 0.1)])
async def test_queueing_is_bounded_by_timeout_and_deadline(queue_timeout, deadline, waited):
    slots = UpstreamSlots("up", limit=1, max_queue=5, queue_timeout=queue_timeout)
    release = asyncio.Event()
    holder = asyncio.ensure_future(hold(slots, [], release))
    await asyncio.sleep(0.01)
    start = time.monotonic()
    with pytest.raises(Saturated) as info:
        async with slots.slot(Deadline.after(deadline) if deadline else None):
            pass
    assert info.value.why == "queue_timeout"
    assert waited - 0.01 <= time.monotonic() - start < waited + 0.3
    assert slots.waiting == 0
    release.set()
    await holder


async def test_cancelled_and_timed_out_waiters_leak_no_capacity():
    slots = UpstreamSlots("up", limit=3, max_queue=50, queue_timeout=0.05)
    release = asyncio.Event()
    holders = [asyncio.ensure_future(hold(slots, [], release)) for _ in range(3)]
    await asyncio.sleep(0.01)
    waiters = [asyncio.ensure_future(hold(slots, [], asyncio.Event())) for _ in range(20)]
    await asyncio.sleep(0.01)
    for w in waiters[:10]:
        w.cancel()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) == 10
    assert sum(isinstance(r, Saturated) for r in results) == 10
    release.set()
    await asyncio.gather(*holders)
    # All three slots are usable again at once.
    peak, gate = [], asyncio.Event()

    async def measure():
        async with slots.slot():
            peak.append(slots.in_use)
            await gate.wait()

    tasks = [asyncio.ensure_future(measure()) for _ in range(3)]
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(*tasks)
    assert max(peak) == 3 and slots.in_use == 0 and slots.waiting == 0


def test_rejects_nonsense():
    with pytest.raises(ValueError):
        UpstreamSlots("up", limit=0)
