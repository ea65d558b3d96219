"""Calls to an upstream over HTTP: JSON answers and SSE streams, whichever API surface.

Every failure leaves here as an UpstreamError carrying the status and body the client
should see; the caller never has to know about aiohttp's exceptions.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator

import aiohttp
import orjson

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamError
from gateway.ops.metrics import Metrics
from gateway.upstream import sse
from gateway.upstream.deadline import Deadline, client_timeout
from gateway.ops import tracing
from gateway.upstream.resilience import Resilience

Headers = tuple[tuple[str, str], ...]


class UpstreamClient:
    def __init__(self, session: aiohttp.ClientSession, metrics: Metrics, resilience: Resilience) -> None:
        self.session = session
        self.metrics = metrics
        self.resilience = resilience

    @property
    def timeout(self) -> aiohttp.ClientTimeout:
        """Timeouts for a single request outside the retrying paths (the plain proxy)."""
        return self._timeout(self.resilience.deadline())

    def _record(self, upstream: str, status: int, started: float) -> None:
        self.metrics.upstream_requests.labels(upstream, str(status)).inc()
        self.metrics.upstream_duration.labels(upstream).observe(time.perf_counter() - started)

    def _timeout(self, deadline: Deadline, stream: bool = False) -> aiohttp.ClientTimeout:
        t = self.resilience.timeouts
        return client_timeout(deadline, t.connect, t.idle, stream)

    async def post_json(self, upstream: UpstreamConfig, path: str, body: dict, headers: Headers,
                        deadline: Deadline | None = None) -> bytes:
        """The upstream's 200 body, retried on connection errors, timeouts, 429 and 5xx
        within `deadline` (by default the configured upstream timeout from now)."""
        deadline = deadline or self.resilience.deadline()
        data = orjson.dumps(body)

        async def attempt() -> bytes:
            async with self.resilience.guard(upstream.name, deadline):
                return await self._post_once(upstream, path, data, headers, deadline)

        return await self.resilience.call(upstream.name, attempt, deadline)

    @contextlib.asynccontextmanager
    async def _post(self, upstream: UpstreamConfig, path: str, data: bytes, headers: Headers,
                    deadline: Deadline, stream: bool = False) -> AsyncIterator[aiohttp.ClientResponse]:
        """The upstream's 200 response; any other status raises its UpstreamError. The call's
        status and latency are recorded when the caller is done with the response."""
        # Transport errors leave raw, so that retry.retry_reason can tell a refused
        # connection from a timeout; Resilience.call turns what is left into an UpstreamError.
        started = time.perf_counter()
        status = 502
        traced = tracing.upstream_attempt(upstream, path, data)
        try:
            async with self.session.post(upstream.url + path, data=data, headers=tracing.inject(traced, _headers(headers)),
                                         timeout=self._timeout(deadline, stream)) as resp:
                status = resp.status
                if resp.status != 200:
                    raise UpstreamError(resp.status, scrubbed(await resp.read(), headers), resp.content_type,
                                        dict(resp.headers))
                yield resp
        except asyncio.TimeoutError:
            status = 504
            raise
        finally:
            self._record(upstream.name, status, started)
            tracing.end_attempt(traced, status)

    async def _post_once(self, upstream: UpstreamConfig, path: str, data: bytes, headers: Headers,
                         deadline: Deadline) -> bytes:
        async with self._post(upstream, path, data, headers, deadline) as resp:
            payload = await resp.read()
        _check_json(upstream.name, payload)
        return payload

    async def stream(self, upstream: UpstreamConfig, path: str, body: dict, headers: Headers,
                     deadline: Deadline | None = None) -> AsyncIterator[bytes]:
        """The payloads of the upstream's SSE events until the stream ends or sends [DONE]
        (yielded too). Whether the stream was complete is its surface's to judge.

        Retried like post_json until the first event arrives, all within `deadline`; after
        that the event is on its way to clients, and a break can only end the stream with an
        error. A stream that keeps sending has no time limit: only a silence longer than the
        idle timeout ends it (a slow answer is not a failing upstream).
        """
        deadline = deadline or self.resilience.deadline()
        data = orjson.dumps(body)

        async def attempt() -> tuple[AsyncIterator[bytes], bytes | None]:
            events = self._stream_once(upstream, path, data, headers, deadline)
            try:
                return events, await anext(events)
            except StopAsyncIteration:
                return events, None

        events, first = await self.resilience.call(upstream.name, attempt, deadline)
        try:
            if first is None:
                return
            yield first
            async for payload in events:
                yield payload
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:  # ValueError: an overlong line
            raise UpstreamError.broken_stream(upstream.name, "the connection failed", repr(exc)) from exc
        finally:
            await events.aclose()

    async def _stream_once(self, upstream: UpstreamConfig, path: str, data: bytes, headers: Headers,
                           deadline: Deadline) -> AsyncIterator[bytes]:
        # The slot and the breaker permit are held until the stream ends, so a stream that
        # breaks mid-way counts against the upstream's health like any other failure.
        async with self.resilience.guard(upstream.name, deadline), \
                self._post(upstream, path, data, headers, deadline, stream=True) as resp:
            async for payload in sse.payloads(resp.content):
                yield payload
                if payload == b"[DONE]":
                    return


def _headers(headers: Headers) -> dict[str, str]:
    return {"Content-Type": "application/json", **dict(headers)}


def scrubbed(payload: bytes, headers: Headers) -> bytes:
    """An upstream's error body with the credentials it was sent taken out: some providers
    quote the key they rejected, and an error is passed on to the client."""
    for name, value in headers:
        if name.lower() in ("authorization", "x-api-key"):
            token = (value.partition(" ")[2].strip() if " " in value else value).encode()
            if token and token in payload:
                payload = payload.replace(token, b"[redacted]")
    return payload


def _check_json(upstream: str, payload: bytes) -> None:
    try:
        if not isinstance(orjson.loads(payload), dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise UpstreamError.unreachable(upstream, "it answered 200 with a body that is not a JSON object",
                                        repr(exc)) from exc
