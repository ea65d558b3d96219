"""The app factory: settings in, a ready aiohttp Application out."""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
from functools import partial
from typing import AsyncIterator

import aiohttp
from aiohttp import web

from gateway.apis import SURFACES
from gateway.cache.owners import Owners
from gateway.cache.entry import Sealer
from gateway.cache.memory_store import MemoryStore
from gateway.cache.near_cache import NearCache
from gateway.cache.redis_store import RedisStore
from gateway.cache.session_store import MemorySessions, RedisSessions
from gateway.cache.singleflight import SingleFlight
from gateway.cache.store import Store, StoreError
from gateway.cache.traced_store import TracedStore
from gateway.cache.storing import FINISHES, StoreRules
from gateway.config import Settings
from gateway.ingress.auth import Tenants
from gateway.ingress.expect import expect_continue
from gateway.ingress.header_safety import finish_headers
from gateway.ingress.limits import TenantLimiter
from gateway.ingress.middlewares import errors, observe
from gateway.ingress.proxy import proxy
from gateway.ops import cache_api, endpoints
from gateway.ops.logs import AccessLog
from gateway.ops.metrics import Metrics
from gateway.ops.readiness import readiness, readyz
from gateway.ops.tracing import Tracing
from gateway.ops.tracing import middleware as traced
from gateway.ops.status import status
from gateway.ops.watch import watch
from gateway.policy.prepare import PreparedMemo
from gateway.route.cached import cached_route
from gateway.state import (
    ACCESS_LOG,
    DISCOVERY,
    GATEWAY,
    METRICS,
    PREPARED,
    SECRET,
    SETTINGS,
    TENANTS,
    Gateway,
)
from gateway.upstream.client import UpstreamClient
from gateway.upstream.discovery import Discovery, discovering
from gateway.upstream.resilience import Resilience

log = logging.getLogger("detgate")

ACCESS_LOG_BUFFER = 64 * 1024
TRACING = web.AppKey("tracing", Tracing)


class ConfigError(Exception):
    """Settings the gateway refuses to start with; the message says what to change."""


def signing_secret(settings: Settings) -> bytes:
    if settings.secret is not None:
        return settings.secret.get_secret_value().encode()
    if settings.redis_url:
        raise ConfigError("--redis-url needs --secret (or DETGATE_SECRET): cache keys are signed with it, and entries "
                          "in Redis outlive this process, so the keys must be the same after a restart and on every replica.")
    log.warning("no --secret given: signing cache keys with a random one; that is fine for the in-process store, "
                "which is lost on restart anyway")
    return secrets.token_bytes(32)


def create_app(settings: Settings) -> web.Application:
    secret = signing_secret(settings)
    tracing = _tracing(settings)
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[observe, errors] if tracing is None else [traced(tracing), observe, errors])
    if tracing is not None:
        app[TRACING] = tracing
        app.on_cleanup.append(lambda _: asyncio.to_thread(tracing.shutdown))
    app[SETTINGS] = settings
    app[SECRET] = secret
    app[METRICS] = Metrics()
    app[METRICS].prime((u.name for u in settings.upstreams), (c.name for c in settings.canaries),
                       (t for t in settings.rate_limits if t != "*"),
                       ((name, t.refresh) for name, t in settings.tenants.items()))
    app[TENANTS] = Tenants.from_settings(settings)
    app[PREPARED] = PreparedMemo()
    app[DISCOVERY] = Discovery(settings, app[PREPARED].clear)
    logged = logging.getLogger("detgate.access").isEnabledFor(logging.INFO)
    # Buffered here: the interpreter's own stderr stream underneath is unbuffered.
    app[ACCESS_LOG] = AccessLog(open(sys.stderr.fileno(), "wb", buffering=ACCESS_LOG_BUFFER, closefd=False)
                                if logged else None)
    app.cleanup_ctx.append(_resources)
    app.cleanup_ctx.append(lambda app: discovering(app, app[DISCOVERY]))
    app.on_response_prepare.append(finish_headers)
    app.cleanup_ctx.append(watch)
    app.cleanup_ctx.append(readiness)
    for surface in SURFACES.values():
        app.router.add_post("/v1" + surface.path, cached_route(surface), name=surface.name,
                            expect_handler=expect_continue)
    app.router.add_get("/v1/models", proxy, name="models")
    app.router.add_route("*", "/v1/{tail:.*}", proxy, name="proxy", expect_handler=expect_continue)
    app.router.add_get("/healthz", endpoints.healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/metrics", endpoints.metrics, name="metrics")
    app.router.add_get("/detgate/status", status, name="status")
    cache_api.add_routes(app)
    return app


def _tracing(settings: Settings) -> Tracing | None:
    if not settings.otlp_endpoint:
        return None
    try:
        return Tracing(settings.otlp_endpoint, os.environ.get("OTEL_SERVICE_NAME", "detgate-gateway"))
    except ImportError as exc:
        raise ConfigError(f"--otlp-endpoint needs OpenTelemetry: pip install 'detgate[otel]' ({exc})") from None


def count_store_error(metrics: Metrics, op: str) -> None:
    if op == "tamper":
        metrics.cache_tamper.inc()
    else:
        metrics.cache_errors.labels(op).inc()


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    metrics = app[METRICS]
    store: Store
    redis_client = None
    if settings.redis_url:
        redis_store = RedisStore(settings.redis_url, settings.store_timeout_s)
        try:
            await redis_store.ping()
        except StoreError as exc:
            if settings.cache_failure == "fail-closed":
                await redis_store.close()
                raise ConfigError(f"cannot reach the store at --redis-url: {exc.detail} (--cache-failure fail-closed)") from None
            log.warning("the store at --redis-url is down (%s); answering uncached until it is back "
                        "(--cache-failure fail-open)", exc.detail)
        store = redis_store
        redis_client = redis_store.client
        if settings.near_cache_ttl_s > 0:
            store = NearCache(redis_store, settings.near_cache_ttl_s, settings.near_cache_bytes)
    else:
        memory = MemoryStore(settings.memory_store_bytes)
        metrics.cache_entries_bytes.set_function(lambda: memory.nbytes)
        store = memory
    if TRACING in app:
        store = TracedStore(store)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024, ttl_dns_cache=300))
    rules = StoreRules.from_settings(settings)
    for finish in FINISHES.difference(rules.finishes):
        metrics.cache_declined.labels(finish)  # at zero from the start, so the first one shows as an increase
    flights = SingleFlight(store, Sealer(app[SECRET]), settings.lock_lease_ms, partial(count_store_error, metrics),
                           rules, lambda entry: metrics.cache_declined.labels(entry.finish).inc())
    limiter = None
    if settings.rate_limits:
        limiter = TenantLimiter(settings, redis_client, lambda exc: metrics.cache_errors.labels("ratelimit").inc())
    client = UpstreamClient(session, metrics, Resilience(settings, metrics))
    sessions = RedisSessions(redis_client) if redis_client is not None else MemorySessions(settings.memory_store_bytes)
    app[GATEWAY] = Gateway(store, flights, Owners(flights, app[SECRET]), client, limiter, sessions)
    log.info("detgate ready: %d upstream(s) %s, store %s", len(settings.upstreams),
             ", ".join(f"{u.name}={u.url}" for u in settings.upstreams), "redis" if settings.redis_url else "in-process")
    try:
        yield
    finally:
        await flights.close()
        await session.close()
        await store.close()
        app[ACCESS_LOG].close()
