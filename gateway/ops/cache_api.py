"""The operator's cache API, behind --operator-token (a gateway without one does not serve it):

    GET    /detgate/cache?tenant=&upstream=&model=&surface=&finish=&fingerprint=&older_than_s=&newer_than_s=
                         &cursor=&limit=
    GET    /detgate/cache/{key}
    DELETE /detgate/cache/{key}
    DELETE /detgate/cache?<filters>        (at least one filter, or all=true)

Answers are JSON with their counts (scanned, matched, deleted, ...), which the metrics count
too. Errors have OpenAI's shape, as the gateway's other endpoints.
"""
from __future__ import annotations

from typing import Awaitable, TypeVar

from aiohttp import web

from gateway.cache.admin import MAX_LIMIT, CacheAdmin, Filters
from gateway.cache.store import StoreError
from gateway.errors import ApiError
from gateway.ingress.auth import authorize_operator
from gateway.state import GATEWAY, METRICS, TENANTS

_PAGING = ("cursor", "limit", "all")
T = TypeVar("T")


def _admin(request: web.Request) -> CacheAdmin:
    if request.app[TENANTS].operator is None:
        raise ApiError(403, "The cache API is served only with an operator token: start the gateway with "
                            "--operator-token (or DETGATE_OPERATOR_TOKEN).", code="operator_token_required")
    authorize_operator(request.headers.get("Authorization"), request.app[TENANTS])
    gateway = request.app[GATEWAY]
    return CacheAdmin(gateway.store, gateway.flights.sealer)


def _filters(request: web.Request) -> Filters:
    try:
        return Filters.parse({k: v for k, v in request.query.items() if k not in _PAGING})
    except ValueError as exc:
        raise ApiError(400, f"{exc}.", code="invalid_filter") from None


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(400, f"limit must be an integer from 1 to {MAX_LIMIT}, not {raw!r}.", param="limit",
                       code="invalid_value")
    return int(raw)


def _count(request: web.Request, op: str, deleted: int = 0, by: str = "key") -> None:
    metrics = request.app[METRICS]
    metrics.cache_admin.labels(op).inc()
    if deleted:
        metrics.cache_admin_deleted.labels(by).inc(deleted)


async def _from_store(work: Awaitable[T]) -> T:
    """Awaits one admin operation; a failing store is the API's 503, not a traceback."""
    try:
        return await work
    except StoreError as exc:
        raise ApiError(503, f"The store failed: {exc}.", type="server_error", code="store_unavailable") from None


def _not_found(key: str) -> ApiError:
    return ApiError(404, f"No cache entry under {key!r}.", code="entry_not_found")


async def list_entries(request: web.Request) -> web.Response:
    admin, filters, limit = _admin(request), _filters(request), _limit(request)
    try:
        page = await _from_store(admin.page(filters, request.query.get("cursor", ""), limit))
    except ValueError as exc:
        raise ApiError(400, f"{exc}.", param="cursor", code="invalid_cursor") from None
    _count(request, "list")
    return web.json_response(page)


async def show_entry(request: web.Request) -> web.Response:
    key = request.match_info["key"]
    shown = await _from_store(_admin(request).show(key))
    _count(request, "show")
    if shown is None:
        raise _not_found(key)
    return web.json_response(shown)


async def delete_entry(request: web.Request) -> web.Response:
    key = request.match_info["key"]
    deleted = await _from_store(_admin(request).delete(key))
    _count(request, "delete", int(bool(deleted)), "key")
    if deleted is None:
        raise _not_found(key)
    return web.json_response({"key": key, "deleted": int(deleted), "changed": int(not deleted)})


async def delete_entries(request: web.Request) -> web.Response:
    admin, filters = _admin(request), _filters(request)
    if filters.empty() and request.query.get("all") != "true":
        raise ApiError(400, "Deleting by filter needs at least one filter (tenant, upstream, model, surface, finish, "
                            "fingerprint, older_than_s, newer_than_s), or all=true to empty the cache.", code="filter_required")
    counts = await _from_store(admin.delete_matching(filters))
    _count(request, "delete_matching", counts.deleted, "filter")
    return web.json_response(vars(counts))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/detgate/cache", list_entries, name="cache_list")
    app.router.add_delete("/detgate/cache", delete_entries, name="cache_delete_matching")
    app.router.add_get("/detgate/cache/{key}", show_entry, name="cache_show")
    app.router.add_delete("/detgate/cache/{key}", delete_entry, name="cache_delete")
