"""SIGTERM drains: a `detgate serve` process stops accepting connections at once, finishes
the requests it is answering, then exits 0."""
from __future__ import annotations

import asyncio
import signal
import socket
import time

from gw_http import CHAT, post


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


async def test_sigterm_finishes_requests_in_flight_and_refuses_new_ones(upstream, gateway_process):
    fake, url = upstream
    fake.behaviour.delay_s = 2.0
    gw = gateway_process(["--upstream", f"fake={url}"])
    in_flight = asyncio.ensure_future(asyncio.to_thread(post, gw.url, "/v1/chat/completions", CHAT))
    while fake.started == 0:
        await asyncio.sleep(0.01)
    gw.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 1.5
    while not refuses_connections(gw.port):
        assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
        await asyncio.sleep(0.05)
    assert not in_flight.done()  # the upstream is still answering it
    reply = await in_flight
    assert (reply.status, reply.cache) == (200, "miss")
    assert await asyncio.to_thread(gw.process.wait, 10) == 0
