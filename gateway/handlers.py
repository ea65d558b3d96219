"""HTTP handlers: the cached API routes (one per surface), health and metrics."""
from __future__ import annotations

import asyncio
import dataclasses
import time

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.apis.surface import Surface, View
from gateway.cache.entry import Entry
from gateway.errors import ApiError, UpstreamError
from gateway.ops.drift import DriftMonitor
from gateway.cache.feed import Feed
from gateway.ingress.auth import REFRESHES, Credentials, Tenant, authorize_operator, authorize_refresh
from gateway.ingress.limits import TenantLimiter, rate_limited
from gateway.cache.modes import MODE_CONTROLS, replay_miss, replay_unavailable
from gateway.strategies.fanout import merged
from gateway.policy.hidden_vars import scan, warning
from gateway.policy.apply import Hints
from gateway.policy.keys import chained
from gateway.policy.prepare import Asked, Prepared
from gateway.cache.singleflight import Flight, Outcome, Produce
from gateway.state import CACHE, GATEWAY, KEY, METRICS, MODEL, PREPARED, SECRET, SETTINGS, TENANT, TENANTS
from gateway.cache.store import StoreError
from gateway.strategies.single import Call, single
from gateway.strategies.spec import SINGLE
from gateway.strategies.voting import choose, meta_headers
from gateway.ops.watch import DRIFT, UPSTREAM

CACHE_CONTROLS = ("no-store", "no-cache", "only-if-cached")
STATEFUL = "stateful"  # the control of a request the gateway passes through uncached (Surface.uncached)


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
    # A header sent on several lines is one comma-separated list (RFC 9110), not its first line.
    keyed = tuple((name, ", ".join(headers.getall(name))) for name in surface.keyed_headers if name in headers)
    return Asked(Credentials.of(headers), keyed,
                 Hints(headers.get("x-detgate-mode"), headers.get("x-detgate-vote"), headers.get("x-detgate-schema")),
                 headers.get("x-detgate-canonical"))


def cached_route(surface: Surface):
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        raw = await read_body(request)
        prepared = app[PREPARED].get(surface, raw, asked(request, surface), app[SETTINGS], app[TENANTS], app[SECRET])
        request[TENANT], request[MODEL], request[KEY] = prepared.tenant.name, prepared.model, prepared.key
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
        if control in REFRESHES and mode == "normal":  # a mode is the operator's, and refreshes by right
            authorize_refresh(prepared.tenant, control, key, metrics)
        request[UPSTREAM] = call.upstream.name
        headers = {"x-detgate-key": key}
        if prepared.warnings:
            headers["x-detgate-warnings"] = "; ".join(prepared.warnings)

        gateway = app[GATEWAY]
        if gateway.limiter is not None:
            await admit(request, gateway.limiter, prepared.tenant.name)
        if prepared.split:
            return await _answer_split(request, prepared, control, headers)
        if prepared.uncached is not None:
            control = _pass_through(request, prepared.uncached, control, headers)
        elif prepared.parent is not None:
            key, control = await _continue(request, prepared, key, control, headers)
        if control == STATEFUL and call.spec is not SINGLE:
            # Each call may change state upstream (a conversation's turns, a background job): one is made.
            call = dataclasses.replace(call, spec=SINGLE)
            _warn(headers, "no vote or schema check: a request passed through uncached is sent once")
        found = await _find_or_fly(request, key, call, control,
                                   _producer(call, gateway.client, drift, prepared.model, headers), headers)
        if isinstance(found, Entry):
            await _own(request, prepared.tenant, surface, found, "hit")
            return _respond(request, surface, found, prepared.view, "hit", headers)
        _flag_hidden(request, call, headers)
        return await _answer(request, prepared.tenant, surface, *found, prepared.view, headers)

    return handler


def _pass_through(request: web.Request, why: str, control: str | None, headers: dict[str, str]) -> str:
    """The control for a request the cache cannot answer (Surface.uncached): answered as
    no-store, with a warning saying why; never in replay or only-if-cached."""
    if control == "only-if-cached":
        replay = request.app[SETTINGS].mode == "replay"
        raise ApiError(404, f"This request is never cached ({why}): only an upstream call can answer it, which "
                            f"{'replay mode' if replay else 'x-detgate-cache-control: only-if-cached'} rules out.",
                       code="replay_miss" if replay else "cache_miss", headers={**headers, "x-detgate-cache": "miss"})
    _warn(headers, f"passed through uncached: {why}")
    return STATEFUL


async def _continue(request: web.Request, prepared: Prepared, key: str, control: str | None,
                    headers: dict[str, str]) -> tuple[str, str | None]:
    """(key, control) of a request that continues an earlier answer: its key bound to that
    answer's key where this tenant was served it from the cache; else it is passed through
    uncached, unless the upstream would see it under a key other tenants share."""
    app = request.app
    try:
        parent = await app[GATEWAY].chains.parent(prepared.tenant, prepared.call.upstream.name, prepared.parent)
    except StoreError:
        app[METRICS].cache_errors.labels("get").inc()
        if app[SETTINGS].cache_failure == "fail-closed" or _shared_credential(app):
            raise store_unavailable("the answer this request continues could not be looked up") from None
        return key, _pass_through(request, "the store is down, so the answer it continues is unknown", control,
                                  headers)
    if parent:
        key = request[KEY] = headers["x-detgate-key"] = chained(app[SECRET], key, parent)
        return key, control
    if parent is None and _shared_credential(app):
        # The operator's key would continue whatever the id names, another tenant's conversation included.
        raise ApiError(404, "The answer this request continues (previous_response_id) is not one this gateway "
                            "served you, or it no longer remembers it.", param="previous_response_id",
                       code="previous_response_not_found")
    why = ("it continues an answer that was served uncached" if parent == "" else
           "it continues an answer this gateway did not serve, or no longer remembers")
    return key, _pass_through(request, why, control, headers)


def _shared_credential(app: web.Application) -> bool:
    """Whether upstreams see several tenants as one account (the operator's key)."""
    return not app[SETTINGS].passthrough_auth and len({tenant.name for _, tenant in app[TENANTS].keys}) > 1


async def _own(request: web.Request, tenant: Tenant, surface: Surface, entry: Entry, cache: str) -> None:
    """Record that `tenant` was served `entry`, so that a later request of its own may
    continue it (Surface.answer_id); before the answer's end goes out, which a client may
    act on at once."""
    answer = surface.answer_id(entry.body)
    if answer is None:
        return
    stored = request[KEY] if cache != "bypass" else ""
    try:
        await request.app[GATEWAY].chains.served(tenant, request[UPSTREAM], answer, stored, entry)
    except StoreError:
        request.app[METRICS].cache_errors.labels("put").inc()


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
    return outcome.entry, _settle(request, outcome, cache, headers)


async def _find_or_fly(request: web.Request, key: str, call: Call, control: str | None, produce: Produce,
                       headers: dict[str, str]) -> Entry | tuple[Flight, str]:
    """The cache's side of answering one key, the same for a whole request and for each part
    of a split: the stored entry on a hit, else the flight that fills it and the cache label
    it starts under. Counts coalesced requests and bypasses known from the start."""
    app = request.app
    metrics = app[METRICS]
    if control in ("no-store", STATEFUL):
        metrics.cache_bypass.labels(control).inc()
        return _unshared(produce), "bypass"
    refresh = control == "no-cache"
    store_down, stale = False, None
    if not refresh:
        entry, stale, store_down = await _lookup(request, key)
        if entry is not None:
            return entry
        if app[SETTINGS].mode == "replay":
            raise replay_unavailable(headers) if store_down else replay_miss(key, call.body, headers)
        if control == "only-if-cached":
            raise _not_cached(key, headers)
    flight, leader = app[GATEWAY].flights.join(key, produce, str(call.body.get("model", "")),
                                               refresh=refresh or stale == "corrupt", replace=stale == "expired")
    if not leader:
        metrics.coalesced.labels(request.match_info.route.name or "").inc()
    if store_down:
        metrics.cache_bypass.labels("store_down").inc()
        return flight, "bypass"
    return flight, "miss" if leader else "coalesced"


def _settle(request: web.Request, outcome: Outcome, cache: str, headers: dict[str, str]) -> str:
    """The cache label an answer goes out under, once its flight has landed; a warning when
    the store rules chose not to keep it (a miss all the same, and again next time)."""
    metrics = request.app[METRICS]
    if not outcome.filled and cache == "miss":
        cache = "coalesced"  # another replica's call answered it
        metrics.coalesced.labels(request.match_info.route.name or "").inc()
    if outcome.declined is not None:
        _warn(headers, f"answer not stored: {outcome.declined}")
    elif not outcome.stored and cache != "bypass":
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


async def _lookup(request: web.Request, key: str) -> tuple[Entry | None, str | None, bool]:
    """(entry, why a stored value must be overwritten: "corrupt" or "expired", whether the
    store failed). A failed store is a 503 when the gateway is configured fail-closed."""
    app = request.app
    try:
        raw = await app[GATEWAY].store.get(key)
    except StoreError as exc:
        app[METRICS].cache_errors.labels("get").inc()
        if app[SETTINGS].cache_failure == "fail-closed":
            raise store_unavailable(str(exc)) from None
        return None, None, True
    if raw is None:
        return None, None, False
    entry = app[GATEWAY].flights.unseal(key, raw)
    if entry is None:
        return None, "corrupt", False
    # Past its TTL, though a copy (the near cache) or a slow clock still holds it.
    return (None, "expired", False) if entry.expired() else (entry, None, False)


def _respond(request: web.Request, surface: Surface, entry: Entry, view: View, cache: str,
             headers: dict[str, str]) -> web.Response:
    request[CACHE] = cache
    headers = {**headers, "x-detgate-cache": cache, "x-detgate-model-version": entry.model}
    if entry.meta:
        headers.update(meta_headers(entry.meta))
    streamed = view.stream and entry.stream is not None
    return web.Response(body=surface.render(entry, view), headers=headers,
                        content_type="text/event-stream" if streamed else "application/json")


async def _answer(request: web.Request, tenant: Tenant, surface: Surface, flight: Flight, cache: str, view: View,
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
        cache = _settle(request, outcome, cache, headers)
        await _own(request, tenant, surface, outcome.entry, cache if outcome.stored else "bypass")
        return _respond(request, surface, outcome.entry, view, cache, headers)
    return await _stream_live(request, tenant, surface, flight, cache, view, headers)


def _warn(headers: dict[str, str], warning: str) -> None:
    headers["x-detgate-warnings"] = "; ".join(filter(None, (headers.get("x-detgate-warnings"), warning)))


async def _stream_live(request: web.Request, tenant: Tenant, surface: Surface, flight: Flight, cache: str,
                       view: View, headers: dict[str, str]) -> web.StreamResponse:
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
        await _own(request, tenant, surface, outcome.entry, cache if outcome.stored else "bypass")
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


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    authorize_operator(request.headers.get("Authorization"), request.app[TENANTS])
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
