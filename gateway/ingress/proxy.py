"""The uncached proxy: paths under /v1 that are not cached routes, passed on to the first
upstream of the request's wire whose allow-list names them (gateway/ingress/allowlist.py),
and to no other.

Under the operator's key an upstream sees one account for every tenant: whatever it keeps
per account (files, batches, vector stores, stored responses) would be every tenant's to
list, read and delete. So the proxy passes on only what is allow-listed (by default the
model listing), only the headers that describe the message, and the client's own
organization and project only with the client's own key (passthrough mode). Where tenants
share the operator's key, a path that names an object (a rule's `{name}` segment) is passed
on only for a tenant that owns it (gateway/cache/owners.py: it was served it, or a proxied
call made it), else it gets the wire's 404; the ids of objects a call makes or lists for a
tenant are recorded as its own; a listing that names no object shows only the tenant's own.
Errors are scrubbed of the credentials sent, as on the cached routes; redirects are not followed.

A request goes to an upstream of the wire it speaks: Anthropic's SDKs send
`anthropic-version` (and their key as `x-api-key`), so their `models.list()` reaches an
Anthropic upstream; any other request goes to the OpenAI upstreams first.
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from gateway.cache.owners import enforced
from gateway.cache.store import StoreError
from gateway.config import Settings, UpstreamConfig
from gateway.errors import ANTHROPIC_ERRORS, OPENAI_ERRORS, ApiError, UpstreamError
from gateway.ingress.allowlist import WIRE_DEFAULTS, Rule, confined, encoded, rules_for
from gateway.ingress.auth import Credentials, Tenant, authenticate, upstream_headers
from gateway.ingress.body import read_body
from gateway.ingress.limits import admit
from gateway.route.lookup import store_unavailable
from gateway.state import CACHE, GATEWAY, METRICS, SETTINGS, TENANT, TENANTS
from gateway.upstream.client import scrubbed

# What of a request is passed on besides the credentials: how its body is written and
# read, and the API-version headers that pick a wire format.
REQUEST_HEADERS = frozenset({"accept", "content-type", "idempotency-key", "openai-beta", "anthropic-version",
                             "anthropic-beta"})
# What of an answer comes back: how to read it and when to retry. Not the upstream's
# organization, rate-limit or tracing headers, which describe the operator's account.
RESPONSE_HEADERS = frozenset({"content-type", "content-disposition", "retry-after", "retry-after-ms",
                              "x-request-id", "request-id"})


def wire_of(headers: Mapping[str, str]) -> str:
    """The wire a request speaks: Anthropic's when it sends an Anthropic API version, or
    its key as `x-api-key` and no `Authorization`; else OpenAI's."""
    if "anthropic-version" in headers or ("x-api-key" in headers and "Authorization" not in headers):
        return "anthropic"
    return "openai"


def allowed(settings: Settings, method: str, segments: tuple[str, ...],
            wire: str) -> list[tuple[UpstreamConfig, str, Rule]]:
    """(upstream, its wire, the rule) of every upstream whose allow-list has the call, in
    the order they are tried: the request's wire's; for a request that does not speak
    Anthropic's, then the others (a bare call of an Anthropic-only path)."""
    found = []
    for upstream in settings.upstreams:
        spoken = settings.rules.profiles[upstream.profile].wire
        rule = next((rule for rule in rules_for(spoken, upstream.proxy) if rule.matches(method, segments)), None)
        if rule is not None and (spoken == wire or wire == "openai"):
            found.append((upstream, spoken, rule))
    found.sort(key=lambda one: one[1] != wire)
    if not found:
        raise ApiError(403, f"{method} /v1{encoded(segments)} is not proxied by this gateway for the {wire} wire: only "
                            "what an upstream's `proxy` list names is (by default GET /v1/models).",
                       type="permission_error", code="path_not_allowed")
    return found


async def proxy(request: web.Request) -> web.StreamResponse:
    wire = wire_of(request.headers)
    try:
        return await _proxy(request, wire)
    except ApiError as exc:
        return exc.response(ANTHROPIC_ERRORS if wire == "anthropic" else OPENAI_ERRORS)


async def _proxy(request: web.Request, wire: str) -> web.StreamResponse:
    app = request.app
    settings = app[SETTINGS]
    credentials = Credentials.of(request.headers)
    tenant = authenticate(credentials, app[TENANTS], settings.passthrough_auth)
    request[TENANT] = tenant.name
    request[CACHE] = "bypass"
    segments = confined(request.raw_path)
    candidates = allowed(settings, request.method, segments, wire)
    shared = enforced(settings, app[TENANTS])
    upstream, spoken, rule = await _owner_of(request, tenant, segments, candidates) if shared else candidates[0]
    gateway = app[GATEWAY]
    if gateway.limiter is not None:
        await admit(gateway.limiter, tenant.name, app[METRICS])
    headers = {k: v for k, v in request.headers.items() if k.lower() in REQUEST_HEADERS}
    sent = upstream_headers(upstream, credentials, settings.passthrough_auth, spoken)
    headers.update(sent)
    body = await read_body(request)
    client, metrics = gateway.client, app[METRICS]
    try:
        upstream_response = await client.session.request(
            request.method, URL(upstream.url + encoded(segments), encoded=True), params=request.query or None,
            data=body or None, headers=headers, timeout=client.timeout, allow_redirects=False)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        metrics.upstream_requests.labels(upstream.name, "502").inc()
        return UpstreamError.unreachable(upstream.name, "the connection failed", repr(exc)).response()
    async with upstream_response:
        metrics.upstream_requests.labels(upstream.name, str(upstream_response.status)).inc()
        passed = {k: v for k, v in upstream_response.headers.items() if k.lower() in RESPONSE_HEADERS}
        owned = shared and f"{request.method} {_spec(rule)}" not in WIRE_DEFAULTS[spoken]
        if upstream_response.status >= 400 or (owned and upstream_response.content_type == "application/json"):
            try:
                payload = await upstream_response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return UpstreamError.broken_stream(upstream.name, "the connection failed", repr(exc)).response()
            if upstream_response.status >= 400:
                return web.Response(status=upstream_response.status, body=scrubbed(payload, sent), headers=passed)
            payload = await _owned_answer(request, tenant, upstream.name, rule, segments, payload)
            return web.Response(status=upstream_response.status, body=payload, headers=passed)
        response = web.StreamResponse(status=upstream_response.status, headers=passed)
        await response.prepare(request)
        try:
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return response  # headers are sent: a broken body can only end early
        await response.write_eof()
        return response


def _spec(rule: Rule) -> str:
    return "/" + "/".join(part if part is not None else "{}" for part in rule.parts)


async def _owner_of(request: web.Request, tenant: Tenant, segments: tuple[str, ...],
                    candidates: list[tuple[UpstreamConfig, str, Rule]]) -> tuple[UpstreamConfig, str, Rule]:
    """The first candidate at which the tenant owns every object the path names; the wire's
    404 where there is none, exactly as for an id no upstream has."""
    owners = request.app[GATEWAY].owners
    for upstream, spoken, rule in candidates:
        named = rule.named(segments)
        try:
            found = [await owners.owns(tenant, upstream.name, one) for one in named]
        except StoreError:
            request.app[METRICS].cache_errors.labels("get").inc()
            raise store_unavailable("who owns the object this path names could not be looked up") from None
        if all(found):
            return upstream, spoken, rule
    raise ApiError(404, f"No object with id {rule.named(segments)[-1]!r} was found.", code="not_found")


async def _owned_answer(request: web.Request, tenant: Tenant, upstream: str, rule: Rule, segments: tuple[str, ...],
                        payload: bytes) -> bytes:
    """A JSON answer of an owned route: the ids it names recorded as the tenant's (an object
    made, the items of one it owns); a listing that names no object cut to the tenant's own."""
    try:
        parsed: Any = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload
    if not isinstance(parsed, dict):
        return payload
    listed = parsed.get("data") if isinstance(parsed.get("data"), list) else []
    owners = request.app[GATEWAY].owners
    if request.method == "GET" and not rule.named(segments) and listed:
        try:
            mine = [item for item in listed if isinstance(item, dict)
                    and isinstance(item.get("id"), str) and await owners.owns(tenant, upstream, item["id"])]
        except StoreError:
            request.app[METRICS].cache_errors.labels("get").inc()
            raise store_unavailable("whose objects this listing holds could not be looked up") from None
        return orjson.dumps({**parsed, "data": mine})
    ids = [parsed.get("id"), *(item.get("id") for item in listed if isinstance(item, dict))]
    try:
        await owners.created(tenant, upstream, [one for one in ids if isinstance(one, str) and one])
    except StoreError:
        # The call is made: its answer is the tenant's own all the same, whose later use of
        # these ids gets the 404 of an id it does not own.
        request.app[METRICS].cache_errors.labels("put").inc()
    return payload
