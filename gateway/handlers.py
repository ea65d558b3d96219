"""HTTP handlers: the cached OpenAI routes, the proxied rest, health and metrics."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.auth import authenticate, upstream_authorization
from gateway.entry import DONE, CorruptEntry, Entry, sse_event
from gateway.errors import ApiError, UpstreamError, error_body
from gateway.feed import Feed
from gateway.prepare import STRATEGY
from gateway.singleflight import Flight, Outcome
from gateway.state import CACHE, GATEWAY, KEY, METRICS, MODEL, PREPARED, SEALER, SECRET, SETTINGS, TENANT, TENANTS
from gateway.store import StoreError
from gateway.strategy import STRATEGIES, Call

CACHE_CONTROLS = ("no-store", "no-cache", "only-if-cached")


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"The request body is larger than this gateway accepts ({exc.text}).",
                       code="request_too_large") from None


def cache_control(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    if value not in CACHE_CONTROLS:
        raise ApiError(400, f"x-detgate-cache-control must be one of {', '.join(CACHE_CONTROLS)}, not {value!r}.",
                       param="x-detgate-cache-control", code="invalid_header")
    return value


def cached_route(route: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        raw = await read_body(request)
        prepared = app[PREPARED].get(route, raw, request.headers.get("Authorization"), app[SETTINGS], app[TENANTS],
                                     app[SECRET])
        request[TENANT], request[MODEL], request[KEY] = prepared.tenant, prepared.model, prepared.key
        metrics = app[METRICS]
        for rule in prepared.rules:
            metrics.canonical_rules.labels(rule).inc()
        control = cache_control(request.headers.get("x-detgate-cache-control"))
        key, call, stream = prepared.key, prepared.call, prepared.call.stream
        headers = {"x-detgate-key": key}
        if prepared.warnings:
            headers["x-detgate-warnings"] = "; ".join(prepared.warnings)

        gateway = app[GATEWAY]
        if control == "no-store":
            feed = Feed()
            task = asyncio.create_task(_unshared(_producer(call, gateway.client), feed))
            return await _answer(request, Flight(feed, task), stream, "bypass", headers)
        refresh = control == "no-cache"
        if not refresh:
            entry, corrupt = await _lookup(request, key)
            if entry is not None:
                return _respond(request, entry, stream, "hit", headers)
            if control == "only-if-cached":
                raise ApiError(404, f"No cached answer for key {key} (x-detgate-cache-control: only-if-cached).",
                               param="x-detgate-cache-control", code="cache_miss", headers=headers)
            refresh = corrupt
        flight, leader = gateway.flights.join(key, _producer(call, gateway.client), refresh=refresh)
        if not leader:
            metrics.coalesced.labels(route).inc()
        return await _answer(request, flight, stream, "miss" if leader else "coalesced", headers)

    return handler


def _producer(call: Call, client):
    strategy = STRATEGIES[STRATEGY]

    async def produce(feed: Feed) -> Entry:
        return await strategy(call, client, feed)

    return produce


async def _unshared(produce, feed: Feed) -> Outcome:
    try:
        return Outcome(await produce(feed), filled=True)
    finally:
        feed.close()


async def _lookup(request: web.Request, key: str) -> tuple[Entry | None, bool]:
    """(entry, whether a stored value was corrupt and should be overwritten)."""
    app = request.app
    try:
        raw = await app[GATEWAY].store.get(key)
    except StoreError:
        app[METRICS].cache_errors.labels("get").inc()
        return None, False
    if raw is None:
        return None, False
    try:
        return app[SEALER].open(key, raw), False
    except CorruptEntry:
        app[METRICS].cache_errors.labels("decode").inc()
        return None, True


def _respond(request: web.Request, entry: Entry, stream: bool, cache: str, headers: dict[str, str]) -> web.Response:
    request[CACHE] = cache
    headers = {**headers, "x-detgate-cache": cache, "x-detgate-model-version": entry.model}
    if stream and entry.sse is not None:
        return web.Response(body=entry.sse, headers=headers, content_type="text/event-stream")
    return web.Response(body=entry.body, headers=headers, content_type="application/json")


async def _answer(request: web.Request, flight: Flight, stream: bool, cache: str,
                  headers: dict[str, str]) -> web.StreamResponse:
    """Serve a flight's answer: live events while they come when streaming, else the entry.

    Waits are shielded: this request going away must not cancel a call others share.
    """
    request[CACHE] = cache
    if stream:
        await asyncio.shield(flight.feed.started())
    if not (stream and flight.feed.events):
        try:
            outcome = await asyncio.shield(flight.task)
        except UpstreamError as exc:
            request[CACHE] = cache
            return _upstream_error(exc, {**headers, "x-detgate-cache": cache})
        if not outcome.filled and cache == "miss":
            cache = "coalesced"  # another replica's call answered it
            request.app[METRICS].coalesced.labels(request.match_info.route.name or "").inc()
        return _respond(request, outcome.entry, stream, cache, headers)
    return await _stream_live(request, flight, cache, headers)


async def _stream_live(request: web.Request, flight: Flight, cache: str, headers: dict[str, str]) -> web.StreamResponse:
    feed = flight.feed
    first = orjson.loads(feed.events[0])
    model = first.get("model") if isinstance(first, dict) else None
    response = web.StreamResponse(headers={**headers, "x-detgate-cache": cache, "x-detgate-model-version": str(model or ""),
                                           "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        async for data in feed.follow():
            await response.write(sse_event(data))
        try:
            await asyncio.shield(flight.task)
        except UpstreamError as exc:
            # Headers are gone: the failure can only be told in-band, as OpenAI does.
            await response.write(sse_event(_in_band_error(exc)))
            return response
        await response.write(DONE)
    except ConnectionResetError:
        pass  # the client left; the flight goes on and is stored if it completes
    return response


def _in_band_error(exc: UpstreamError) -> bytes:
    try:
        parsed = orjson.loads(exc.body)
        if isinstance(parsed, dict) and "error" in parsed:
            return orjson.dumps(parsed)
    except orjson.JSONDecodeError:
        pass
    return error_body(f"upstream failed with status {exc.status}", type="upstream_error")


def _upstream_error(exc: UpstreamError, headers: dict[str, str]) -> web.Response:
    response = exc.response()
    response.headers.update(headers)
    for name in ("retry-after", "retry-after-ms"):
        value = next((v for k, v in exc.headers.items() if k.lower() == name), None)
        if value is not None:
            response.headers[name] = value
    return response


async def models(request: web.Request) -> web.StreamResponse:
    return await proxy(request)


# Hop-by-hop and transport headers are the connection's business, not the message's.
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
                  "host", "upgrade", "te", "trailer", "proxy-authorization", "proxy-authenticate"})


async def proxy(request: web.Request) -> web.StreamResponse:
    """Anything else under /v1/: passed to the default upstream uncached, streamed back."""
    app = request.app
    settings = app[SETTINGS]
    client_auth = request.headers.get("Authorization")
    request[TENANT] = authenticate(client_auth, app[TENANTS], settings.passthrough_auth)
    request[CACHE] = "bypass"
    upstream = settings.upstreams[0]
    url = upstream.url + request.path[len("/v1"):]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP and k.lower() != "authorization"}
    authorization = upstream_authorization(upstream, client_auth, settings.passthrough_auth)
    if authorization:
        headers["Authorization"] = authorization
    body = await request.read()
    client = app[GATEWAY].client
    try:
        upstream_response = await client.session.request(request.method, url, params=request.query, data=body or None,
                                                         headers=headers, timeout=client.timeout)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        app[METRICS].upstream_requests.labels(upstream.name, "502").inc()
        return UpstreamError.unreachable(upstream.name, repr(exc)).response()
    async with upstream_response:
        app[METRICS].upstream_requests.labels(upstream.name, str(upstream_response.status)).inc()
        response = web.StreamResponse(status=upstream_response.status, headers={
            k: v for k, v in upstream_response.headers.items() if k.lower() not in _HOP})
        await response.prepare(request)
        try:
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return response  # headers are sent: a broken body can only end early
        await response.write_eof()
        return response


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
