"""One deadline, read by every stage, and the aiohttp timeouts derived from it."""
import asyncio
import time

import aiohttp
import pytest

from gateway.upstream.deadline import Deadline, client_timeout
from fakes.fault_upstream import FaultUpstream
from fakes.faults import FaultPlan


def test_remaining_never_goes_negative():
    now = [10.0]
    d = Deadline.after(5, clock=lambda: now[0])
    assert d.remaining() == 5 and not d.expired() and d.allows(4.9) and not d.allows(5)
    now[0] = 20.0
    assert d.remaining() == 0 and d.expired()


def test_a_whole_answer_is_bounded_by_the_deadline_and_a_stream_by_its_silences():
    now = [0.0]
    d = Deadline.after(3, clock=lambda: now[0])
    whole = client_timeout(d, connect=1, idle=10)
    assert (whole.total, whole.sock_connect, whole.sock_read) == (3, 1, None)
    stream = client_timeout(d, connect=5, idle=10, stream=True)
    assert (stream.total, stream.sock_connect, stream.sock_read) == (None, 3, 10)


async def test_a_stalled_stream_fails_after_the_idle_timeout_not_the_deadline():
    async with FaultUpstream(FaultPlan(stall_s=0.6), seed=9) as up, aiohttp.ClientSession() as http:
        up.script.append("stall")
        start = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(f"{up.url}/chat/completions", timeout=client_timeout(Deadline.after(30), 1, 0.2, stream=True),
                                 json={"model": "m", "messages": [], "stream": True}) as r:
                async for _ in r.content.iter_any():
                    pass
        assert 0.2 <= time.monotonic() - start < 0.55  # before the stall ends at 0.6 s
