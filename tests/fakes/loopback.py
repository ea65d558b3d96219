"""Free loopback ports, and an aiohttp app served on one from a background thread.

A thread with its own event loop lets synchronous clients (the official `openai` client,
`requests`-style code) and async tests talk to the server alike without blocking it.
"""
from __future__ import annotations

import asyncio
import random
import socket
import threading

from aiohttp import web


def free_port(also_free: int = 0) -> int:
    """A loopback port that is free now and, when `also_free` is given, whose port +
    `also_free` is too (a Redis Cluster node's bus listens on port + 10000)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if also_free == 0 or (port + also_free < 65536 and bindable(port + also_free)):
            return port
    raise RuntimeError("no free loopback port pair found")


def bindable(port: int) -> bool:
    with socket.socket() as s:
        # As redis-server does: lets the port be reused while old connections sit in TIME_WAIT.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LoopbackServer:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        # Handlers still sleeping (a fake told to hang) would be destroyed pending with the loop.
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


PACE_GAP_S = 0.25  # the mean pause between the writes of a paced stream; no pause exceeds 1.5x it


async def write_scattered(response: web.StreamResponse, wire: bytes, rng: random.Random, delay_s: float,
                          pace_s: float = 0.0) -> None:
    """Several events per TCP write, split at random, like a real provider under load.

    With `pace_s` the writes are spread over about that many seconds, as a model writes a
    long answer: the first event at once (a provider opens its stream before it generates),
    the rest cut at random places, with a random pause of 0.5-1.5x PACE_GAP_S after each
    write, so no silence comes near an idle timeout of a second or more.
    """
    if pace_s:
        opened = wire.find(b"\n\n") + 2
        writes = max(1, min(len(wire) - opened, round(pace_s / PACE_GAP_S)))
        cuts = [0, opened, *sorted(rng.sample(range(opened + 1, len(wire)), writes - 1)), len(wire)]
        for start, end in zip(cuts, cuts[1:]):
            await response.write(wire[start:end])
            if end < len(wire):
                await asyncio.sleep(PACE_GAP_S * rng.uniform(0.5, 1.5))
        return
    at = 0
    while at < len(wire):
        step = rng.randint(1, 200)
        await response.write(wire[at:at + step])
        at += step
        if delay_s:
            await asyncio.sleep(delay_s)
