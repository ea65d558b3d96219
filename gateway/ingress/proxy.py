"""The uncached proxy: paths under /v1 that are not cached routes, passed on to the first
upstream whose allow-list names them (gateway/ingress/allowlist.py), and to no other.

Under the operator's key an upstream sees one account for every tenant: whatever it keeps
per account (files, batches, vector stores, stored responses) would be every tenant's to
list, read and delete. So the proxy passes on only what is allow-listed (by default the
model listing), only the headers that describe the message, and the client's own
organization and project only with the client's own key (passthrough mode). Errors are
scrubbed of the credentials sent, as on the cached routes; redirects are not followed.
"""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from yarl import URL

from gateway.config import Settings, UpstreamConfig
from gateway.errors import ApiError, UpstreamError
from gateway.ingress.allowlist import confined, encoded, rules_for
from gateway.ingress.auth import Credentials, authenticate, upstream_headers
from gateway.ingress.body import read_body
from gateway.ingress.limits import admit
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


def allowed(settings: Settings, method: str, segments: tuple[str, ...]) -> tuple[UpstreamConfig, str]:
    """The first upstream whose allow-list has the call, and the wire it speaks."""
    for upstream in settings.upstreams:
        wire = settings.rules.profiles[upstream.profile].wire
        if any(rule.matches(method, segments) for rule in rules_for(wire, upstream.proxy)):
            return upstream, wire
    raise ApiError(403, f"{method} /v1{encoded(segments)} is not proxied by this gateway: only what an upstream's "
                        "`proxy` list names is (by default GET /v1/models).", type="permission_error",
                   code="path_not_allowed")


async def proxy(request: web.Request) -> web.StreamResponse:
    app = request.app
    settings = app[SETTINGS]
    credentials = Credentials.of(request.headers)
    tenant = authenticate(credentials, app[TENANTS], settings.passthrough_auth)
    request[TENANT] = tenant.name
    request[CACHE] = "bypass"
    segments = confined(request.raw_path)
    upstream, wire = allowed(settings, request.method, segments)
    gateway = app[GATEWAY]
    if gateway.limiter is not None:
        await admit(gateway.limiter, tenant.name, app[METRICS])
    headers = {k: v for k, v in request.headers.items() if k.lower() in REQUEST_HEADERS}
    sent = upstream_headers(upstream, credentials, settings.passthrough_auth, wire)
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
        if upstream_response.status >= 400:
            try:
                payload = await upstream_response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return UpstreamError.broken_stream(upstream.name, "the connection failed", repr(exc)).response()
            return web.Response(status=upstream_response.status, body=scrubbed(payload, sent), headers=passed)
        response = web.StreamResponse(status=upstream_response.status, headers=passed)
        await response.prepare(request)
        try:
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return response  # headers are sent: a broken body can only end early
        await response.write_eof()
        return response
