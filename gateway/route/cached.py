"""The cached route of one API surface: prepare the request, then answer it from the cache
or from one upstream call shared by every identical request in flight."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from functools import partial

from aiohttp import web

from gateway.apis.surface import Surface
from gateway.cache.entry import Entry, now_in_ms
from gateway.cache.origin import fill_origin
from gateway.cache.feed import Feed
from gateway.cache.modes import MODE_CONTROLS
from gateway.cache.recordings import asking
from gateway.errors import ApiError, UpstreamError
from gateway.ingress.auth import REFRESHES, Credentials, authorize_refresh
from gateway.ingress.body import read_body
from gateway.ingress.limits import admit
from gateway.ops.drift import DriftMonitor
from gateway.ops.watch import DRIFT, UPSTREAM
from gateway.policy.apply import Hints
from gateway.policy.hidden_vars import scan, warning
from gateway.policy.key_rules import apply, recognise
from gateway.policy.prepare import Asked, Prepared
from gateway.route.answer import answer, respond, upstream_error
from gateway.route.chains import check_state, continue_chain, kept_apart, own, pass_through
from gateway.route.lookup import STATEFUL, find_or_fly, settle
from gateway.route.warnings import warn
from gateway.state import (
    CACHE,
    DISCOVERY,
    GATEWAY,
    KEY,
    METRICS,
    MODEL,
    PREPARED,
    SECRET,
    SETTINGS,
    TENANT,
    TENANTS,
)
from gateway.strategies.checked_stream import checked_stream
from gateway.strategies.fanout import merged
from gateway.strategies.single import Call, single
from gateway.strategies.spec import SINGLE
from gateway.strategies.voting import choose
from gateway.upstream.discovery import settled

CACHE_CONTROLS = ("no-store", "no-cache", "only-if-cached")


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
    keyed = tuple((name, ", ".join(headers.getall(name))) for name in surface.keyed_headers
                  if name in headers) if surface.keyed_headers else ()
    return Asked(Credentials.of(headers), keyed,
                 Hints(headers.get("x-detgate-mode"), headers.get("x-detgate-vote"), headers.get("x-detgate-schema")),
                 headers.get("x-detgate-canonical"), recognise(headers.get("user-agent")))


def cached_route(surface: Surface):
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        raw = await read_body(request)
        prepared = await settled(app[DISCOVERY], partial(app[PREPARED].get, surface, raw, asked(request, surface),
                                                         tenants=app[TENANTS], secret=app[SECRET]))
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
            await admit(gateway.limiter, prepared.tenant.name, metrics)
        await check_state(request, prepared, surface, call.body)
        if prepared.split:
            return await _answer_split(request, prepared, control, headers)
        key = kept_apart(request, surface, call.body, key, headers)
        if prepared.uncached is not None:
            control = pass_through(request, prepared.uncached, control, headers)
        elif prepared.parent is not None:
            key, control = await continue_chain(request, prepared, key, control, headers)
        if control == STATEFUL and call.spec is not SINGLE:
            # Each call may change state upstream (a conversation's turns, a background job): one is made.
            call = dataclasses.replace(call, spec=SINGLE)
            warn(headers, "no vote or schema check: a request passed through uncached is sent once")
        found = await find_or_fly(request, key, call, control,
                                   _producer(call, gateway.client, drift, prepared, headers, app[SETTINGS].mode),
                                   headers,
                                   asking(prepared, request.headers, surface.apart(call.body))
                                   if control != STATEFUL and prepared.parent is None else None)
        if isinstance(found, Entry):
            if surface.names_state:
                await own(request, prepared.tenant, surface, found, True)
            return respond(request, surface, found, prepared.view, "hit", headers)
        _flag_hidden(request, prepared, headers)
        if call.stream and call.spec.asked:
            warn(headers, f"stream buffered: {call.spec.name} was asked for, and it chooses among whole answers")
        return await answer(request, prepared.tenant, surface, *found, prepared.view, headers)

    return handler


def _producer(call: Call, client, drift: DriftMonitor, prepared: Prepared, headers: dict[str, str], mode: str):
    strategy = strategy_for(call)
    model = prepared.model

    async def produce(feed: Feed) -> Entry:
        entry = await strategy(call, client, feed)
        # Who filled it and for what (the operator's cache API), built only on a fill.
        entry = dataclasses.replace(entry, origin={**fill_origin(prepared, call, mode), "filled_at_ms": now_in_ms()})
        # Observed before the entry is stored, so that the answer which revealed a drift says
        # so (through `headers`, read once the flight lands; a stream's have left by then).
        event = await drift.observe(call.upstream.name, model, call.surface.fingerprint(entry.body))
        if event is not None:
            warn(headers, event.warning())
        return entry

    return produce


def strategy_for(call: Call):
    """What a miss runs. A stream runs buffered only for a strategy asked for by name; checks
    its tools or response format imply run at the end of the live stream."""
    if call.spec is SINGLE:
        return single
    if call.stream and not call.spec.asked:
        return checked_stream
    return choose


def _flag_hidden(request: web.Request, prepared: Prepared, headers: dict[str, str]) -> None:
    """Warn about keyed values that change per request. On misses only: the scan costs
    time, and a hit already proves that its key repeats."""
    call = prepared.call
    # What the key was signed over, made again from what is sent: cheaper than the memo
    # holding every request's keyed form besides its body.
    keyed, _ = apply(call.surface.canonical(call.body, True).key, prepared.applicable)
    findings = scan(keyed, time.time(), call.surface.resent)
    if not findings:
        return
    metrics = request.app[METRICS]
    for finding in findings:
        metrics.hidden_variables.labels(finding.kind).inc()
    warn(headers, warning(findings))


async def _answer_split(request: web.Request, prepared: Prepared, control: str | None, headers: dict[str, str]) -> web.Response:
    """n > 1 split by the profile: each part looked up or filled on its own key, all at
    once, then merged in order. The first failing part's error is the answer."""
    drift = request.app[DRIFT]
    parts = [(drift.key(key, call.upstream.name, prepared.model), call) for key, call in prepared.split]
    headers["x-detgate-key"] = request[KEY] = ",".join(key for key, _ in parts)
    if control != "only-if-cached" and request.app[SETTINGS].mode != "replay":
        _flag_hidden(request, prepared, headers)
    try:
        results = await asyncio.gather(*(_part(request, key, call, control, prepared, headers)
                                         for key, call in parts))
    except UpstreamError as exc:
        request[CACHE] = "miss"
        return upstream_error(exc, prepared.call.surface, {**headers, "x-detgate-cache": "miss"})
    caches = {cache for _, cache in results}
    cache = "hit" if caches == {"hit"} else next(c for c in ("bypass", "miss", "coalesced") if c in caches)
    call = prepared.call
    entry = merged(call.surface, call.upstream.name, [entry for entry, _ in results])
    return respond(request, call.surface, entry, prepared.view, cache, headers)


async def _part(request: web.Request, key: str, call: Call, control: str | None, prepared: Prepared,
                headers: dict[str, str]) -> tuple[Entry, str]:
    """One part of a split: (its entry, how it was found)."""
    app = request.app
    found = await find_or_fly(request, key, call, control,
                               _producer(call, app[GATEWAY].client, app[DRIFT], prepared, headers, app[SETTINGS].mode),
                               headers)
    if isinstance(found, Entry):
        return found, "hit"
    flight, cache = found
    outcome = await asyncio.shield(flight.task)
    return outcome.entry, settle(request, outcome, cache, headers)

