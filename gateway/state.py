"""What handlers share, kept on the app under typed keys."""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.cache.owners import Owners
from gateway.cache.session_store import SessionStore
from gateway.cache.singleflight import SingleFlight
from gateway.cache.store import Store
from gateway.config import Settings
from gateway.ingress.auth import Tenants
from gateway.ingress.limits import TenantLimiter
from gateway.ops.logs import AccessLog
from gateway.ops.metrics import Metrics
from gateway.policy.prepare import PreparedMemo
from gateway.upstream.client import UpstreamClient
from gateway.upstream.discovery import Discovery


@dataclass(frozen=True)
class Gateway:
    """The per-process resources, built by the app's cleanup context once the loop runs."""

    store: Store
    flights: SingleFlight
    owners: Owners  # the ids of upstream state each tenant was served or made
    client: UpstreamClient
    limiter: TenantLimiter | None = None  # per-tenant rate limits, when configured
    sessions: SessionStore | None = None  # recorded agent sessions (gateway/cache/session_store.py)


SETTINGS = web.AppKey("settings", Settings)
SECRET = web.AppKey("secret", bytes)
METRICS = web.AppKey("metrics", Metrics)
TENANTS = web.AppKey("tenants", Tenants)
GATEWAY = web.AppKey("gateway", Gateway)
ACCESS_LOG = web.AppKey("access_log", AccessLog)
PREPARED = web.AppKey("prepared", PreparedMemo)
# The settings as the upstreams' announced profiles amend them (gateway/upstream/discovery.py).
DISCOVERY = web.AppKey("discovery", Discovery)

# Filled in by handlers for the metrics/log middleware.
MODEL = web.RequestKey("model", str)
CACHE = web.RequestKey("cache", str)
KEY = web.RequestKey("key", str)
TENANT = web.RequestKey("tenant", str)
# Warnings found once a stream's headers had left (an answer not stored): for the access log.
LATE_WARNINGS = web.RequestKey("late_warnings", str)
