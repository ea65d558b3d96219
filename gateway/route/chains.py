"""Requests that continue an earlier answer (Surface.parent_id), and requests the cache
cannot answer at all (Surface.uncached): keyed on the answer they continue where this
tenant was served it, else passed through uncached."""
from __future__ import annotations

from aiohttp import web

from gateway.apis.surface import Surface
from gateway.cache.entry import Entry
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
        raise ApiError(404, f"This request is never cached ({why}): only an upstream call can answer it, which "
                            f"{'replay mode' if replay else 'x-detgate-cache-control: only-if-cached'} rules out.",
                       code="replay_miss" if replay else "cache_miss", headers={**headers, "x-detgate-cache": "miss"})
    warn(headers, f"passed through uncached: {why}")
    return STATEFUL


async def continue_chain(request: web.Request, prepared: Prepared, key: str, control: str | None,
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
        return key, pass_through(request, "the store is down, so the answer it continues is unknown", control,
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
    return key, pass_through(request, why, control, headers)


def _shared_credential(app: web.Application) -> bool:
    """Whether upstreams see several tenants as one account (the operator's key)."""
    return not app[SETTINGS].passthrough_auth and len({tenant.name for _, tenant in app[TENANTS].keys}) > 1


async def own(request: web.Request, tenant: Tenant, surface: Surface, entry: Entry, stored: bool) -> None:
    """Record that `tenant` was served `entry` (in the store under the request's key, or not
    `stored`), so that a later request of its own may continue it (Surface.answer_id);
    before the answer's end goes out, which a client may act on at once."""
    chains = request.app[GATEWAY].chains
    key = request[KEY] if stored else ""
    if key and chains.known(tenant, request[UPSTREAM], key):
        return  # a hot hit: its link is written, and its body need not be read again
    answer = surface.answer_id(entry.body)
    if answer is None:
        return
    try:
        await chains.served(tenant, request[UPSTREAM], answer, key, entry)
    except StoreError:
        request.app[METRICS].cache_errors.labels("put").inc()
