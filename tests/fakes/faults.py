"""Faults the fake provider (openai_upstream.FakeUpstream) can serve, one chosen per call:
from a script first, then at random by weight from a seeded RNG.

    ok               a normal answer
    500              an OpenAI-shaped 500 error
    429              a 429 with Retry-After (delta-seconds or an HTTP-date)
    reset            the connection is dropped before any byte is sent
    slow_first_byte  a normal answer after `slow_first_byte_s` of silence
    stall            a stream that goes silent mid-way for `stall_s`, then drops
                     (a non-stream request just hangs for `stall_s`, then drops)
    broken           the connection drops mid-body: a stream without [DONE], or a JSON
                     body shorter than its Content-Length
    failed           the wire's own failure of an answer begun (Responses: a `response.failed`
                     stream or a 200 body with status failed; Anthropic: 529 overloaded_error);
                     an answer elsewhere
    error_event      an `error` event mid-stream (Responses: server_error; Anthropic:
                     overloaded_error), a 500 (Anthropic: 529) for a body; an answer elsewhere

Refused connections are a property of the listener, not of a call: see
fault_upstream.FaultUpstream.refuse().
"""
from __future__ import annotations

import asyncio
import collections
import email.utils
import random
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

FAULT = web.RequestKey("fault", str)  # the fault Faults.next() chose for a call, for its route's handler
FAULTS = ("ok", "500", "429", "reset", "slow_first_byte", "stall", "broken", "failed", "error_event")


@dataclass
class FaultPlan:
    weights: dict[str, float] = field(default_factory=lambda: {"ok": 1.0})
    retry_after: float = 1.0  # seconds a 429 asks for
    retry_after_format: str = "seconds"  # or "date": an HTTP-date that far in the future
    slow_first_byte_s: float = 0.5
    stall_s: float = 30.0

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {sorted(unknown)}; known: {FAULTS}")
        if self.retry_after_format not in ("seconds", "date"):
            raise ValueError("retry_after_format is 'seconds' or 'date'")


def parse_weights(spec: str) -> dict[str, float]:
    """"ok=90,500=4,..." -> {"ok": 90.0, "500": 4.0, ...}"""
    pairs = (item.split("=", 1) for item in spec.split(",") if item)
    return {name: float(weight) for name, weight in pairs}


def _error(status: int, message: str, type_: str, code: str | None, headers: dict | None = None) -> web.Response:
    body = orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def drop(request: web.Request) -> web.Response:
    if request.transport is not None:  # None: the client hung up first
        request.transport.abort()
    # The handler must still return; aiohttp discards a response for a closed transport.
    return web.Response(status=500)


class Faults:
    def __init__(self, plan: FaultPlan | None = None, seed: int | None = None) -> None:
        self.plan = plan or FaultPlan()
        self.rng = random.Random(seed)
        self.script: collections.deque[str] = collections.deque()  # faults to serve first, in order
        self.served: collections.Counter[str] = collections.Counter()  # fault -> calls served with it

    def next(self) -> str:
        fault = self.script.popleft() if self.script else self.rng.choices(
            list(self.plan.weights), weights=list(self.plan.weights.values()))[0]
        self.served[fault] += 1
        return fault

    async def early(self, request: web.Request, fault: str) -> web.StreamResponse | None:
        """The response for a fault that strikes before an answer starts; None: answer."""
        if fault == "500":
            return _error(500, "the server had an error", "server_error", None)
        if fault == "429":
            return _error(429, "rate limit reached", "requests", "rate_limit_exceeded",
                          {"Retry-After": self._retry_after()})
        if fault == "reset":
            return drop(request)
        if fault == "slow_first_byte":
            await asyncio.sleep(self.plan.slow_first_byte_s)
        return None

    def cut(self, events: int) -> int:
        """Where a stalled or broken stream stops: after at least one event, before the last."""
        return self.rng.randint(1, max(1, events - 1))

    async def whole(self, request: web.Request, payload: bytes, fault: str) -> web.StreamResponse:
        """A non-stream answer, hung or cut off by a late fault."""
        if fault == "stall":
            await asyncio.sleep(self.plan.stall_s)
            return drop(request)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: len(payload) // 2])
        return drop(request)

    def _retry_after(self) -> str:
        if self.plan.retry_after_format == "date":
            return email.utils.formatdate(time.time() + self.plan.retry_after, usegmt=True)
        return f"{self.plan.retry_after:g}"
