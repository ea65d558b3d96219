"""Calls to an upstream over HTTP with the OpenAI wire format: JSON answers and SSE streams.

Every failure leaves here as an UpstreamError carrying the status and body the client
should see; the caller never has to know about aiohttp's exceptions.
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import aiohttp
import orjson

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamError
from gateway.metrics import Metrics

PATHS = {"chat.completions": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings"}


class UpstreamClient:
    def __init__(self, session: aiohttp.ClientSession, metrics: Metrics, timeout_s: float) -> None:
        self.session = session
        self.metrics = metrics
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    def _record(self, upstream: str, status: int, started: float) -> None:
        self.metrics.upstream_requests.labels(upstream, str(status)).inc()
        self.metrics.upstream_duration.labels(upstream).observe(time.perf_counter() - started)

    async def post_json(self, upstream: UpstreamConfig, route: str, body: dict, authorization: str | None) -> bytes:
        started = time.perf_counter()
        status = 502
        try:
            async with self.session.post(upstream.url + PATHS[route], data=orjson.dumps(body),
                                         headers=_headers(authorization), timeout=self.timeout) as resp:
                status = resp.status
                payload = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(resp.status, payload, resp.content_type, dict(resp.headers))
                _check_json(upstream.name, payload)
                return payload
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            status = 504 if isinstance(exc, asyncio.TimeoutError) else 502
            raise UpstreamError.unreachable(upstream.name, repr(exc), status) from exc
        finally:
            self._record(upstream.name, status, started)

    async def stream(self, upstream: UpstreamConfig, route: str, body: dict,
                     authorization: str | None) -> AsyncIterator[bytes]:
        """The payloads of the upstream's SSE events up to [DONE]; raises unless [DONE] came."""
        started = time.perf_counter()
        status = 502
        try:
            async with self.session.post(upstream.url + PATHS[route], data=orjson.dumps(body),
                                         headers=_headers(authorization), timeout=self.timeout) as resp:
                status = resp.status
                if resp.status != 200:
                    raise UpstreamError(resp.status, await resp.read(), resp.content_type, dict(resp.headers))
                async for data in _sse_payloads(resp.content):
                    if data == b"[DONE]":
                        return
                    _check_chunk(upstream.name, data)
                    yield data
                raise UpstreamError.broken_stream(upstream.name, "closed before [DONE]")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:  # ValueError: an overlong line
            status = 504 if isinstance(exc, asyncio.TimeoutError) else 502
            raise UpstreamError.broken_stream(upstream.name, repr(exc)) from exc
        finally:
            self._record(upstream.name, status, started)


def _headers(authorization: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    return headers


def _check_json(upstream: str, payload: bytes) -> None:
    try:
        if not isinstance(orjson.loads(payload), dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise UpstreamError.unreachable(upstream, f"answered 200 with a body that is not a JSON object ({exc})") from exc


def _check_chunk(upstream: str, data: bytes) -> None:
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError.broken_stream(upstream, f"an event that is not JSON ({exc})") from exc
    if not isinstance(chunk, dict) or "error" in chunk:
        raise UpstreamError.broken_stream(upstream, f"error event {data[:500]!r}")


async def _sse_payloads(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Event payloads: `data:` lines joined by newlines, an event ending at a blank line."""
    lines: list[bytes] = []
    async for raw in content:
        line = raw.rstrip(b"\r\n")
        if not line:
            if lines:
                yield b"\n".join(lines)
                lines = []
        elif line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    if lines:
        yield b"\n".join(lines)
