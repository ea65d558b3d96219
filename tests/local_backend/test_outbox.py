"""The engine's hand-off to the event loop: everything arrives, in order, and the engine runs at
most one lot ahead of a loop that does not read."""
from __future__ import annotations

import asyncio
import time

from local_backend.engine.outbox import Outbox


async def test_a_lot_waits_until_the_last_was_read_or_the_stall_limit():
    loop, queue, outbox = asyncio.get_running_loop(), asyncio.Queue(), Outbox(stall_seconds=0.3)

    def send(lot) -> float:
        for event in lot:
            outbox.put(loop, queue, event)
        start = time.perf_counter()
        outbox.send()
        return time.perf_counter() - start

    # The engine thread sends two lots while this loop is held: the first goes at once, the
    # second waits for the first to be read, and goes when the stall limit runs out.
    worker = loop.run_in_executor(None, lambda: [send([1, 2]), send([3])])
    time.sleep(0.5)
    first, second = await worker
    assert first < 0.1 and 0.25 < second < 0.45
    # Once the loop runs, it reads them in order, and the next lot goes at once.
    assert await asyncio.to_thread(send, [4]) < 0.1
    assert [await queue.get() for _ in range(4)] == [1, 2, 3, 4]
