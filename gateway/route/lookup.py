"""The cache's side of answering one key: a stored entry on a hit, else the flight that
fills it, and the label (miss, coalesced, bypass) the answer goes out under."""
from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.cache.entry import Entry
from gateway.cache.feed import Feed
from gateway.cache.modes import replay_miss, replay_unavailable
from gateway.cache.recordings import Asking, Recordings, explain, gone, replay_warning
from gateway.cache.singleflight import Flight, Outcome, Produce
from gateway.cache.store import StoreError
from gateway.errors import ApiError
from gateway.ops.watch import DRIFT
from gateway.route.warnings import warn
from gateway.state import CACHE, GATEWAY, METRICS, SECRET, SETTINGS
from gateway.strategies.single import Call

STATEFUL = "stateful"  # the control of a request the gateway passes through uncached (Surface.uncached)


async def find_or_fly(request: web.Request, key: str, call: Call, control: str | None, produce: Produce,
                      headers: dict[str, str], asking: Asking | None = None) -> Entry | tuple[Flight, str]:
    """The cache's side of answering one key, the same for a whole request and for each part
    of a split: the stored entry on a hit, else the flight that fills it and the cache label
    it starts under. Counts coalesced requests and bypasses known from the start. `asking`
    (not for a split) records the request as a session's turn, or replays it as one."""
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
            if store_down:
                raise replay_unavailable(headers)
            return await _replay(request, key, call, asking, headers)
        if control == "only-if-cached":
            raise _not_cached(key, headers)
    flight, leader = app[GATEWAY].flights.join(key, produce, str(call.body.get("model", "")),
                                               refresh=refresh or stale == "corrupt", replace=stale == "expired")
    if not leader:
        metrics.coalesced.labels(request.match_info.route.name or "").inc()
    if asking is not None and app[SETTINGS].mode == "record":
        recorded = asyncio.ensure_future(_recorded(request, flight.task, asking, key, headers))
        # A failed call is told to whoever waits; a client that left waits no more.
        recorded.add_done_callback(lambda task: task.cancelled() or task.exception())
        flight = Flight(flight.feed, recorded)
    if store_down:
        metrics.cache_bypass.labels("store_down").inc()
        return flight, "bypass"
    return flight, "miss" if leader else "coalesced"


def settle(request: web.Request, outcome: Outcome, cache: str, headers: dict[str, str]) -> str:
    """The cache label an answer goes out under, once its flight has landed; a warning when
    the store rules chose not to keep it (a miss all the same, and again next time)."""
    metrics = request.app[METRICS]
    if not outcome.filled and cache == "miss":
        cache = "coalesced"  # another replica's call answered it
        metrics.coalesced.labels(request.match_info.route.name or "").inc()
    if outcome.declined is not None:
        warn(headers, f"answer not stored: {outcome.declined}")
    elif not outcome.stored and cache != "bypass":
        # The store failed while this answer was being filled: it went out uncached.
        if request.app[SETTINGS].cache_failure == "fail-closed":
            raise store_unavailable("the answer could not be stored")
        cache = "bypass"
        metrics.cache_bypass.labels("store_down").inc()
    return cache


async def _replay(request: web.Request, key: str, call: Call, asking: Asking | None,
                  headers: dict[str, str]) -> Entry:
    """A replayed request whose exact key missed: the turn recorded for the same conversation
    with other tool outputs, or the replay miss that says what is nearest."""
    request[CACHE] = "miss"  # for the access log, unless a turn answers
    if asking is None:
        raise replay_miss(key, call.body, headers)
    recordings = _recordings(request)
    try:
        found = await recordings.same_but_tool_outputs(asking)
        if found is not None:
            turn, changed = found
            entry, _, _ = await _lookup(request, turn.key)
            if entry is None:
                raise replay_miss(key, call.body, headers, gone(turn))
            headers["x-detgate-key"] = turn.key
            warn(headers, replay_warning(turn, changed))
            return entry
        near = await recordings.nearest(asking)
        explained = () if near is None else explain(near, asking.parts.route, asking.document())
    except RecursionError:  # JSON nested deeper than the comparison walks: told without a nearest
        explained = ()
    except StoreError:
        request.app[METRICS].cache_errors.labels("get").inc()
        raise replay_unavailable(headers) from None
    raise replay_miss(key, call.body, headers, *explained)


def _recordings(request: web.Request) -> Recordings:
    app = request.app
    return Recordings(app[GATEWAY].sessions, app[SECRET], app[DRIFT].key)


async def _recorded(request: web.Request, task: asyncio.Task[Outcome], asking: Asking, key: str,
                    headers: dict[str, str]) -> Outcome:
    """A record-mode flight's outcome, once its answer, if stored, is kept as a turn of its
    session: before a whole answer is sent, and before a live stream's closing bytes."""
    outcome = await task
    if outcome.stored and outcome.declined is None:
        try:
            await _recordings(request).record(asking, key)
        except StoreError as exc:
            request.app[METRICS].cache_errors.labels("session").inc()
            warn(headers, f"session turn not recorded: {exc}")
    return outcome


def _unshared(produce: Produce) -> Flight:
    """A flight of this request's own, for no-store: joined by no one, stored nowhere."""
    feed = Feed()

    async def fly() -> Outcome:
        try:
            return Outcome(await produce(feed), filled=True)
        finally:
            feed.close()

    return Flight(feed, asyncio.create_task(fly()))


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
