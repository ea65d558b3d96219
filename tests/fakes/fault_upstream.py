"""The fake provider with faults, served on the caller's own event loop, whose listener can
be closed and reopened on the same port (clients then get ECONNREFUSED in between).

Answers come from openai_upstream.FakeUpstream (chat, completions, embeddings, Responses)
and, on /v1/messages, anthropic_upstream.FakeAnthropic; which call fails how, from one
faults.Faults, each wire failing in its own shapes.

    async with FaultUpstream(FaultPlan(weights={"ok": 9, "500": 1}), seed=1) as up:
        ... post to up.url + "/chat/completions" ...

Run it alone for a load test:
    python3 tests/fakes/fault_upstream.py --port 9100 --weights ok=90,500=4,429=3,broken=3
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from aiohttp import web

if __package__ in (None, ""):  # run as a script: make `fakes` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes.faults import FAULTS, FaultPlan, Faults, parse_weights  # noqa: E402
from fakes.anthropic_upstream import FakeAnthropic  # noqa: E402
from fakes.openai_upstream import FakeUpstream, Noise  # noqa: E402


class FaultUpstream:
    def __init__(self, plan: FaultPlan | None = None, seed: int | None = None, chunk_delay_s: float = 0.0):
        self.faults = Faults(plan, seed)
        self.fake = FakeUpstream(Noise(seed=seed), faults=self.faults)
        self.fake.behaviour.chunk_delay_s = chunk_delay_s
        self.claude = FakeAnthropic(Noise(seed=seed), check_key=False, faults=self.faults)
        self.claude.behaviour.chunk_delay_s = chunk_delay_s
        self.host = "127.0.0.1"
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    @property
    def plan(self) -> FaultPlan:
        return self.faults.plan

    @property
    def script(self):
        return self.faults.script

    @property
    def served(self):
        return self.faults.served

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self, port: int = 0) -> FaultUpstream:
        app = self.fake.app()
        app.router.add_post("/v1/messages", self.claude._messages)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, port)
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def refuse(self) -> None:
        """Stop listening: new connections are refused until accept()."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def accept(self) -> None:
        if self._site is None:
            self._site = web.TCPSite(self._runner, self.host, self.port)
            await self._site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._site = None

    async def __aenter__(self) -> FaultUpstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _serve(args: argparse.Namespace) -> None:
    plan = FaultPlan(weights=parse_weights(args.weights), retry_after=args.retry_after,
                     retry_after_format=args.retry_after_format, slow_first_byte_s=args.slow_first_byte,
                     stall_s=args.stall)
    upstream = await FaultUpstream(plan, args.seed, args.chunk_delay).start(args.port)
    print(f"fault upstream listening on {upstream.url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await upstream.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--weights", default="ok=1", help="fault=weight,... from: " + ",".join(FAULTS))
    p.add_argument("--retry-after", type=float, default=1.0)
    p.add_argument("--retry-after-format", choices=("seconds", "date"), default="seconds")
    p.add_argument("--slow-first-byte", type=float, default=0.5)
    p.add_argument("--stall", type=float, default=30.0)
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream writes")
    try:
        asyncio.run(_serve(p.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
