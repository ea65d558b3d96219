"""HTTP handlers: the cached API routes (one per surface), the proxied rest, health and metrics."""
from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.ingress.auth import authenticate, upstream_authorization
from gateway.apis.surface import Surface, View
from gateway.cache.entry import Entry
from gateway.errors import ApiError, UpstreamError
from gateway.ops.drift import DriftMonitor
from gateway.cache.feed import Feed
from gateway.ingress.limits import TenantLimiter, rate_limited
from gateway.cache.modes import MODE_CONTROLS, replay_miss, replay_unavailable
from gateway.strategies.fanout import merged
from gateway.policy.hidden_vars import scan, warning
from gateway.policy.apply import Hints
from gateway.policy.prepare import Asked, Prepared
from gateway.cache.singleflight import Flight, Outcome, Produce
from gateway.state import CACHE, GATEWAY, KEY, METRICS, MODEL, PREPARED, SECRET, SETTINGS, TENANT, TENANTS
from gateway.cache.store import StoreError
from gateway.strategies.single import Call, single
from gateway.strategies.spec import SINGLE
from gateway.strategies.voting import choose, meta_headers
from gateway.ops.watch import DRIFT, UPSTREAM

CACHE_CONTROLS = ("no-store", "no-cache", "only-if-cached")


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"The request body is larger than this gateway accepts ({exc.text}).",
                       code="request_too_large") from None
    except RequestPayloadError:
        # e.g. "Content-Encoding: gzip" on a body that is not gzip
        raise ApiError(400, "The request body could not be read as its headers describe it "
                            "(Content-Encoding or framing).", code="invalid_body") from None


def cache_control(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    if value not in CACHE_CONTROLS:
        raise ApiError(400, f"x-detgate-cache-control must be one of {', '.join(CACHE_CONTROLS)}, not {value!r}.",
                       param="x-detgate-cache-control", code="invalid_header")
    return value


def asked(request: web.Request, surface: Surface) -> Asked:
    headers = request.headers
    keyed = tuple((name, headers[name]) for name in surface.keyed_headers if name in headers)
    return Asked(headers.get("Authorization"), keyed,
                 Hints(headers.get("x-detgate-mode"), headers.get("x-detgate-vote"), headers.get("x-detgate-schema")))


def cached_route(surface: Surface):
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        raw = await read_body(request)
        prepared = app[PREPARED].get(surface, raw, asked(request, surface), app[SETTINGS], app[TENANTS], app[SECRET])
        request[TENANT], request[MODEL], request[KEY] = prepared.tenant, prepared.model, prepared.key
        metrics = app[METRICS]
        for rule in prepared.rules:
            metrics.count(metrics.canonical_rules, rule)
        for param in prepared.rewrites:
            metrics.count(metrics.param_rewrites, param)
        control = cache_control(request.headers.get("x-detgate-cache-control"))
        mode = app[SETTINGS].mode
        if mode != "normal":
            control = MODE_CONTROLS[mode]
        call = prepared.call
        drift = app[DRIFT]
        key = request[KEY] = drift.key(prepared.key, call.upstream.name, prepared.model)
        request[UPSTREAM] = call.upstream.name
        headers = {"x-detgate-key": key}
        if prepared.warnings:
            headers["x-detgate-warnings"] = "; ".join(prepared.warnings)

        gateway = app[GATEWAY]
        if gateway.limiter is not None:
            await admit(request, gateway.limiter, prepared.tenant)
        if prepared.split:
            return await _answer_split(request, prepared, control, headers)
        found = await _find_or_fly(request, key, call, control,
                                   _producer(call, gateway.client, drift, prepared.model, headers), headers)
        if isinstance(found, Entry):
            return _respond(request, surface, found, prepared.view, "hit", headers)
        _flag_hidden(request, call, headers)
        return await _answer(request, surface, *found, prepared.view, headers)

    return handler


def _producer(call: Call, client, drift: DriftMonitor, model: str, headers: dict[str, str]):
    strategy = single if call.spec is SINGLE else choose

    async def produce(feed: Feed) -> Entry:
        entry = await strategy(call, client, feed)
        # Observed before the entry is stored, so that the answer which revealed a drift says
        # so (through `headers`, read once the flight lands; a stream's have left by then).
        event = await drift.observe(call.upstream.name, model, call.surface.fingerprint(entry.body))
        if event is not None:
            _warn(headers, event.warning())
        return entry

    return produce


def _flag_hidden(request: web.Request, call: Call, headers: dict[str, str]) -> None:
    """Warn about prompt values that change per request. On misses only: the scan costs
    time, and a hit already proves that its key repeats."""
    findings = scan(call.surface.texts(call.body), time.time())
    if not findings:
        return
    metrics = request.app[METRICS]
    for finding in findings:
        metrics.hidden_variables.labels(finding.kind).inc()
    _warn(headers, warning(findings))


async def _answer_split(request: web.Request, prepared: Prepared, control: str | None, headers: dict[str, str]) -> web.Response:
    """n > 1 split by the profile: each part looked up or filled on its own key, all at
    once, then merged in order. The first failing part's error is the answer."""
    drift = request.app[DRIFT]
    parts = [(drift.key(key, call.upstream.name, prepared.model), call) for key, call in prepared.split]
    headers["x-detgate-key"] = request[KEY] = ",".join(key for key, _ in parts)
    if control != "only-if-cached" and request.app[SETTINGS].mode != "replay":
        _flag_hidden(request, prepared.split[0][1], headers)
    try:
        results = await asyncio.gather(*(_part(request, key, call, control, prepared.model, headers)
                                         for key, call in parts))
    except UpstreamError as exc:
        request[CACHE] = "miss"
        return _upstream_error(exc, prepared.call.surface, {**headers, "x-detgate-cache": "miss"})
    caches = {cache for _, cache in results}
    cache = "hit" if caches == {"hit"} else next(c for c in ("bypass", "miss", "coalesced") if c in caches)
    call = prepared.call
    entry = merged(call.surface, call.upstream.name, [entry for entry, _ in results])
    return _respond(request, call.surface, entry, prepared.view, cache, headers)


async def _part(request: web.Request, key: str, call: Call, control: str | None, model: str,
                headers: dict[str, str]) -> tuple[Entry, str]:
    """One part of a split: (its entry, how it was found)."""
    app = request.app
    found = await _find_or_fly(request, key, call, control,
                               _producer(call, app[GATEWAY].client, app[DRIFT], model, headers), headers)
    if isinstance(found, Entry):
        return found, "hit"
    flight, cache = found
    outcome = await asyncio.shield(flight.task)
    return outcome.entry, _settle(request, outcome, cache)


async def _find_or_fly(request: web.Request, key: str, call: Call, control: str | None, produce: Produce,
                       headers: dict[str, str]) -> Entry | tuple[Flight, str]:
    """The cache's side of answering one key, the same for a whole request and for each part
    of a split: the stored entry on a hit, else the flight that fills it and the cache label
    it starts under. Counts coalesced requests and bypasses known from the start."""
    app = request.app
    metrics = app[METRICS]
    if control == "no-store":
        metrics.cache_bypass.labels("no-store").inc()
        return _unshared(produce), "bypass"
    refresh = control == "no-cache"
    store_down = False
    if not refresh:
        entry, corrupt, store_down = await _lookup(request, key)
        if entry is not None:
            return entry
        if app[SETTINGS].mode == "replay":
            raise replay_unavailable(headers) if store_down else replay_miss(key, call.body, headers)
        if control == "only-if-cached":
            raise _not_cached(key, headers)
        refresh = corrupt
    flight, leader = app[GATEWAY].flights.join(key, produce, refresh=refresh)
    if not leader:
        metrics.coalesced.labels(request.match_info.route.name or "").inc()
    if store_down:
        metrics.cache_bypass.labels("store_down").inc()
        return flight, "bypass"
    return flight, "miss" if leader else "coalesced"


def _settle(request: web.Request, outcome: Outcome, cache: str) -> str:
    """The cache label an answer goes out under, once its flight has landed."""
    metrics = request.app[METRICS]
    if not outcome.filled and cache == "miss":
        cache = "coalesced"  # another replica's call answered it
        metrics.coalesced.labels(request.match_info.route.name or "").inc()
    if not outcome.stored and cache != "bypass":
        # The store failed while this answer was being filled: it went out uncached.
        if request.app[SETTINGS].cache_failure == "fail-closed":
            raise store_unavailable("the answer could not be stored")
        cache = "bypass"
        metrics.cache_bypass.labels("store_down").inc()
    return cache


def _unshared(produce: Produce) -> Flight:
    """A flight of this request's own, for no-store: joined by no one, stored nowhere."""
    feed = Feed()

    async def fly() -> Outcome:
        try:
            return Outcome(await produce(feed), filled=True)
        finally:
            feed.close()

    return Flight(feed, asyncio.create_task(fly()))


async def admit(request: web.Request, limiter: TenantLimiter, tenant: str) -> None:
    decision = await limiter.check(tenant)
    if not decision.allowed:
        request.app[METRICS].rate_limited.labels(tenant).inc()
        raise rate_limited(tenant, decision)


def _not_cached(key: str, headers: dict[str, str]) -> ApiError:
    return ApiError(404, f"No cached answer for key {key} (x-detgate-cache-control: only-if-cached).",
                    param="x-detgate-cache-control", code="cache_miss", headers=headers)


def store_unavailable(what: str) -> ApiError:
    return ApiError(503, f"The cache store is unavailable ({what}) and this gateway is configured "
                         "--cache-failure fail-closed: it answers only what it can store. Retry shortly.",
                    type="server_error", code="cache_unavailable", headers={"Retry-After": "1"})


async def _lookup(request: web.Request, key: str) -> tuple[Entry | None, bool, bool]:
    """(entry, whether a stored value was corrupt and should be overwritten, whether the
    store failed). A failed store is a 503 when the gateway is configured fail-closed."""
    app = request.app
    try:
        raw = await app[GATEWAY].store.get(key)
    except StoreError as exc:
        app[METRICS].cache_errors.labels("get").inc()
        if app[SETTINGS].cache_failure == "fail-closed":
            raise store_unavailable(str(exc)) from None
        return None, False, True
    if raw is None:
        return None, False, False
    entry = app[GATEWAY].flights.unseal(key, raw)
    return entry, entry is None, False


def _respond(request: web.Request, surface: Surface, entry: Entry, view: View, cache: str,
             headers: dict[str, str]) -> web.Response:
    request[CACHE] = cache
    headers = {**headers, "x-detgate-cache": cache, "x-detgate-model-version": entry.model}
    if entry.meta:
        headers.update(meta_headers(entry.meta))
    streamed = view.stream and entry.stream is not None
    return web.Response(body=surface.render(entry, view), headers=headers,
                        content_type="text/event-stream" if streamed else "application/json")


async def _answer(request: web.Request, surface: Surface, flight: Flight, cache: str, view: View,
                  headers: dict[str, str]) -> web.StreamResponse:
    """Serve a flight's answer: live frames while they come when streaming, else the entry.

    Waits are shielded: this request going away must not cancel a call others share.
    """
    request[CACHE] = cache
    if view.stream:
        await asyncio.shield(flight.feed.started())
    if not (view.stream and flight.feed.events):
        try:
            outcome = await asyncio.shield(flight.task)
        except UpstreamError as exc:
            return _upstream_error(exc, surface, {**headers, "x-detgate-cache": cache})
        return _respond(request, surface, outcome.entry, view, _settle(request, outcome, cache), headers)
    return await _stream_live(request, surface, flight, cache, view, headers)


def _warn(headers: dict[str, str], warning: str) -> None:
    headers["x-detgate-warnings"] = "; ".join(filter(None, (headers.get("x-detgate-warnings"), warning)))


async def _stream_live(request: web.Request, surface: Surface, flight: Flight, cache: str, view: View,
                       headers: dict[str, str]) -> web.StreamResponse:
    feed = flight.feed
    drift = request.app[DRIFT].peek(request[UPSTREAM], request[MODEL], feed.fingerprint)
    if drift is not None:
        _warn(headers, drift)
    response = web.StreamResponse(headers={**headers, "x-detgate-cache": cache, "x-detgate-model-version": feed.model,
                                           "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        async for frame in feed.follow():
            await response.write(frame)
        try:
            outcome = await asyncio.shield(flight.task)
        except UpstreamError as exc:
            # Headers are gone: the failure can only be told in-band, as the providers do.
            await response.write(surface.in_band_error(exc))
            return response
        await response.write(surface.stream_end(outcome.entry, view))
    except ConnectionResetError:
        pass  # the client left; the flight goes on and is stored if it completes
    return response


def _upstream_error(exc: UpstreamError, surface: Surface, headers: dict[str, str]) -> web.Response:
    response = exc.response(surface.errors)
    response.headers.update(headers)
    for name in ("retry-after", "retry-after-ms", "x-detgate-attempts"):
        value = next((v for k, v in exc.headers.items() if k.lower() == name), None)
        if value is not None:
            response.headers[name] = value
    return response


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
    body = await read_body(request)
    client = app[GATEWAY].client
    try:
        upstream_response = await client.session.request(request.method, url, params=request.query, data=body or None,
                                                         headers=headers, timeout=client.timeout)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        app[METRICS].upstream_requests.labels(upstream.name, "502").inc()
        return UpstreamError.unreachable(upstream.name, "the connection failed", repr(exc)).response()
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
