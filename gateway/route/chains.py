"""Requests that name upstream state: an earlier answer they continue (Surface.parent_id),
other ids of state the upstream keeps (Surface.state_ids), and requests the cache cannot
answer at all (Surface.uncached). Every id is checked against the ownership registry
(gateway/cache/owners.py); an answer's own ids are recorded there when it is served."""
from __future__ import annotations

from aiohttp import web

from gateway.apis.surface import Surface
from gateway.cache.entry import Entry
from gateway.cache.owners import enforced
from gateway.cache.store import StoreError
from gateway.errors import ApiError
from gateway.ingress.auth import Tenant
from gateway.ops.watch import UPSTREAM
from gateway.policy.keys import chained
from gateway.policy.prepare import Prepared
from gateway.route.lookup import STATEFUL, store_unavailable
from gateway.route.warnings import warn
from gateway.state import GATEWAY, KEY, METRICS, SECRET, SETTINGS, TENANTS


def pass_through(request: web.Request, why: str, control: str | None, headers: dict[str, str]) -> str:
    """The control for a request the cache cannot answer (Surface.uncached): answered as
    no-store, with a warning saying why; never in replay or only-if-cached."""
    if control == "only-if-cached":
        replay = request.app[SETTINGS].mode == "replay"
        # A replay miss is a 400 on every wire, as gateway/cache/modes.py says why.
        raise ApiError(400 if replay else 404, f"This request is never cached ({why}): only an upstream call can answer it, which "
                            f"{'replay mode' if replay else 'x-detgate-cache-control: only-if-cached'} rules out.",
                       code="replay_miss" if replay else "cache_miss", headers={**headers, "x-detgate-cache": "miss"})
    warn(headers, f"passed through uncached: {why}")
    return STATEFUL


def kept_apart(request: web.Request, surface: Surface, body: dict, key: str, headers: dict[str, str]) -> str:
    """The key of a request whose answers are kept apart from others of its key
    (Surface.apart: a Responses `store: false`), bound to what sets them apart."""
    apart = surface.apart(body)
    if not apart:
        return key
    # "#" starts no cache key: the name cannot pass for a parent's key.
    key = request[KEY] = headers["x-detgate-key"] = chained(request.app[SECRET], key, "#" + apart)
    return key


async def check_state(request: web.Request, prepared: Prepared, surface: Surface, body: dict) -> None:
    """Refuse, in the wire's own words (a 404, as the upstream would for an id it does not
    know), a request naming an id of upstream state its tenant was neither served nor made,
    where the upstream sees every tenant as one account; before the cache is asked, since
    a hit would tell as much as the upstream."""
    app = request.app
    if not enforced(app[SETTINGS], app[TENANTS]):
        return
    owners = app[GATEWAY].owners
    for param, named in surface.state_ids(body):
        try:
            owned = await owners.owns(prepared.tenant, prepared.call.upstream.name, named)
        except StoreError:
            app[METRICS].cache_errors.labels("get").inc()
            raise store_unavailable(f"who may use {param} could not be looked up") from None
        if not owned:
            raise ApiError(404, f"No object with id {named!r} was found ({param}).", param=param, code="not_found")


async def continue_chain(request: web.Request, prepared: Prepared, key: str, control: str | None,
                    headers: dict[str, str]) -> tuple[str, str | None]:
    """(key, control) of a request that continues an earlier answer: its key bound to that
    answer's key where this tenant was served it from the cache; else it is passed through
    uncached, unless the upstream would see it under a key other tenants share."""
    app = request.app
    shared = enforced(app[SETTINGS], app[TENANTS])
    try:
        parent = await app[GATEWAY].owners.parent(prepared.tenant, prepared.call.upstream.name, prepared.parent)
    except StoreError:
        app[METRICS].cache_errors.labels("get").inc()
        if app[SETTINGS].cache_failure == "fail-closed" or shared:
            raise store_unavailable("the answer this request continues could not be looked up") from None
        return key, pass_through(request, "the store is down, so the answer it continues is unknown", control,
                                  headers)
    if parent:
        key = request[KEY] = headers["x-detgate-key"] = chained(app[SECRET], key, parent)
        return key, control
    if parent is None and shared:
        # The operator's key would continue whatever the id names, another tenant's conversation included.
        raise ApiError(404, "The answer this request continues (previous_response_id) is not one this gateway "
                            "served you, or it no longer remembers it.", param="previous_response_id",
                       code="previous_response_not_found")
    why = ("it continues an answer that was served uncached" if parent == "" else
           "it continues an answer this gateway did not serve, or no longer remembers")
    return key, pass_through(request, why, control, headers)


async def own(request: web.Request, tenant: Tenant, surface: Surface, entry: Entry, stored: bool) -> None:
    """Record that `tenant` was served `entry` (in the store under the request's key, or not
    `stored`), so that a later request of its own may continue it (Surface.answer_id) and
    use the ids of upstream state it names (Surface.named_ids); before the answer's end
    goes out, which a client may act on at once."""
    await own_body(request, tenant, surface, entry.body, entry, request[KEY] if stored else "")


async def own_body(request: web.Request, tenant: Tenant, surface: Surface, body: bytes, entry: Entry | None,
                   key: str = "") -> None:
    """The same for an answer body served (`entry` None: one passed on as it came, never
    stored, such as a background response still queued)."""
    owners = request.app[GATEWAY].owners
    if key and owners.known(tenant, request[UPSTREAM], key):
        return  # a hot hit: its records are written, and its body need not be read again
    answer = surface.answer_id(body) if surface.chains else None
    named = surface.named_ids(body)
    if answer is None and not named and not key:
        return
    try:
        await owners.served(tenant, request[UPSTREAM], answer, named, key,
                            entry if entry is not None else Entry(body, None, "", "stop"))
    except StoreError:
        request.app[METRICS].cache_errors.labels("put").inc()
