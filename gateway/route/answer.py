"""Sending an answer: the stored entry rendered for this request, or a flight's live frames."""
from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.apis.surface import Surface, View
from gateway.cache.entry import Entry
from gateway.cache.storing import rejection
from gateway.cache.singleflight import Flight
from gateway.errors import UpstreamError
from gateway.ingress.auth import Tenant
from gateway.ops.watch import DRIFT, UPSTREAM
from gateway.route.chains import own, own_body
from gateway.route.lookup import settle
from gateway.route.warnings import warn
from gateway.state import CACHE, LATE_WARNINGS, METRICS, MODEL
from gateway.strategies.voting import meta_headers


def respond(request: web.Request, surface: Surface, entry: Entry, view: View, cache: str,
             headers: dict[str, str]) -> web.Response:
    request[CACHE] = cache
    headers = {**headers, "x-detgate-cache": cache, "x-detgate-model-version": entry.model}
    if entry.meta:
        headers.update(meta_headers(entry.meta))
    streamed = view.stream and entry.stream is not None
    return web.Response(body=surface.render(entry, view), headers=headers,
                        content_type="text/event-stream" if streamed else "application/json")


async def answer(request: web.Request, tenant: Tenant, surface: Surface, flight: Flight, cache: str, view: View,
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
            await _own_passed_on(request, tenant, surface, exc)
            if exc.status == 200 and exc.body is not None:  # an answer passed on unfinished
                body, kind = surface.passed_on(exc.body, view)
                return web.Response(body=body, content_type=kind, headers={**headers, "x-detgate-cache": cache})
            return upstream_error(exc, surface, {**headers, "x-detgate-cache": cache})
        cache = settle(request, outcome, cache, headers)
        if surface.names_state:
            await own(request, tenant, surface, outcome.entry, outcome.stored and cache != "bypass")
        return respond(request, surface, outcome.entry, view, cache, headers)
    return await _stream_live(request, tenant, surface, flight, cache, view, headers)


async def _stream_live(request: web.Request, tenant: Tenant, surface: Surface, flight: Flight, cache: str,
                       view: View, headers: dict[str, str]) -> web.StreamResponse:
    feed = flight.feed
    drift = request.app[DRIFT].peek(request[UPSTREAM], request[MODEL], feed.fingerprint)
    if drift is not None:
        warn(headers, drift)
    response = web.StreamResponse(headers={**headers, "x-detgate-cache": cache, "x-detgate-model-version": feed.model,
                                           "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        async for frame in feed.follow():
            await response.write(surface.echo_frame(frame, view))
        try:
            outcome = await asyncio.shield(flight.task)
        except UpstreamError as exc:
            # Headers are gone: the failure can only be told in-band, as the providers do.
            await _own_passed_on(request, tenant, surface, exc)
            await response.write(surface.in_band_error(exc))
            return response
        # What this reader was sent live: the flight's own answer, also where another replica's
        # call stored a different one first (its frames went out before the race was lost).
        sent = outcome.overtaken or outcome.entry
        if cache != "bypass" and outcome.declined is None and (outcome.overtaken or not outcome.stored):
            # Headers said miss; the cache holds no such answer: bench/load_faults.py's bound.
            request.app[METRICS].live_unstored.labels(request.match_info.route.name or "").inc()
        if surface.names_state:
            await own(request, tenant, surface, sent, outcome.stored and not outcome.overtaken and cache != "bypass")
        unstored = outcome.declined or rejection(outcome.entry)
        if unstored is not None:
            # The headers are gone: said in the access log, and to the client as an SSE
            # comment, which every SSE reader skips.
            request[LATE_WARNINGS] = late = f"answer not stored: {unstored}"
            await response.write(b": x-detgate-warnings: " + " ".join(late.splitlines()).encode() + b"\n\n")
        await response.write(surface.stream_end(sent, view))
    except ConnectionResetError:
        pass  # the client left; the flight goes on and is stored if it completes
    return response


async def _own_passed_on(request: web.Request, tenant: Tenant, surface: Surface, exc: UpstreamError) -> None:
    """An answer passed on unfinished with its 200 (a background response still queued, a
    failed one) names upstream state too: its tenant may poll, cancel or continue it."""
    if exc.status == 200 and exc.body is not None and surface.names_state:
        await own_body(request, tenant, surface, exc.body, None)


def upstream_error(exc: UpstreamError, surface: Surface, headers: dict[str, str]) -> web.Response:
    response = exc.response(surface.errors)
    response.headers.update(headers)
    for name in ("retry-after", "retry-after-ms", "x-detgate-attempts"):
        value = next((v for k, v in exc.headers.items() if k.lower() == name), None)
        if value is not None:
            response.headers[name] = value
    return response
