"""The engine's hand-off to the HTTP side: everything arrives, in order, and the engine runs at
most one lot ahead of a receiver that does not read."""
from __future__ import annotations

import asyncio
import time

from local_backend.engine.outbox import Outbox


async def test_a_lot_waits_until_the_last_was_read_or_the_stall_limit():
    loop, received, outbox = asyncio.get_running_loop(), [], Outbox(stall_seconds=0.3)

    def deliver(lot):   # as EngineThread hands a lot to the loop, which answers once it has run
        loop.call_soon_threadsafe(lambda: (received.extend(e for _, e in lot.events), outbox.was_read()))

    outbox.connect(deliver)

    def send(events) -> float:
        outbox.lot.events.extend((0, e) for e in events)
        start = time.perf_counter()
        outbox.send()
        return time.perf_counter() - start

    # The engine thread sends two lots while this loop is held: the first goes at once, the
    # second waits for the first to be read, and goes when the stall limit runs out.
    worker = loop.run_in_executor(None, lambda: [send([1, 2]), send([3])])
    time.sleep(0.5)
    first, second = await worker
    assert first < 0.1 and 0.25 < second < 0.45
    assert 0.25 < outbox.waited < 0.45   # what the step's numbers report as its hand-off wait
    # Once the loop runs, it reads them in order, and the next lot goes at once.
    assert await asyncio.to_thread(send, [4]) < 0.1
    await asyncio.sleep(0.05)
    assert received == [1, 2, 3, 4]


def test_an_engine_driven_directly_drops_its_lots():
    outbox = Outbox(stall_seconds=5)
    for _ in range(3):
        outbox.lot.events.append((0, "event"))
        start = time.perf_counter()
        outbox.send()
        assert time.perf_counter() - start < 0.1 and not outbox.lot
