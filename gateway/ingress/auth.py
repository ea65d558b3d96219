"""Who is asking: the tenant a request is cached under, what it may do, and the credentials
sent upstream on its behalf."""
from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import Mapping, NamedTuple

from gateway.config import SHARED_NAMESPACE, Settings, UpstreamConfig
from gateway.errors import ApiError
from gateway.ops.metrics import Metrics
from gateway.policy.keys import tenant_from_api_key
from gateway.upstream.wires import credential_headers

log = logging.getLogger("detgate")

DEFAULT_TENANT = "default"
REFRESHES = ("no-cache", "no-store")  # the cache controls that are a tenant's right, not everyone's

# Headers by which an OpenAI client picks which of its key's organizations and projects
# answers (model access, fine-tunes, quotas, data retention). Forwarded only with the
# client's own key: under the operator's key they would let a client pick the operator's.
ACCOUNT_HEADERS = ("openai-organization", "openai-project")


@dataclass(frozen=True)
class Tenant:
    name: str  # in logs, metrics and rate limits
    namespace: str  # whose entries it reads and writes: signed into every key it makes
    refresh: bool = False  # may send x-detgate-cache-control no-cache / no-store


class Credentials(NamedTuple):
    """What a request presents, as sent: hashable, so preparation can be remembered by it (a
    tuple, built and hashed on every cache hit)."""

    authorization: str | None = None
    account: tuple[tuple[str, str], ...] = ()  # ACCOUNT_HEADERS sent, lower-cased names

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> Credentials:
        # Built only when sent: this runs on every cache hit, and most clients send neither.
        sent = "openai-organization" in headers or "openai-project" in headers
        account = tuple((h, headers[h]) for h in ACCOUNT_HEADERS if h in headers) if sent else ()
        return cls(_authorization(headers), account)


def _authorization(headers: Mapping[str, str]) -> str | None:
    """`Authorization`, else Anthropic's `x-api-key` read as the bearer token it stands for,
    so that a client authenticates with its SDK's own header."""
    if "Authorization" in headers:
        return headers["Authorization"]
    key = headers.get("x-api-key")
    return f"Bearer {key}" if key else None


@dataclass(frozen=True)
class Tenants:
    """Gateway API keys, compared in constant time so response timing leaks nothing about them."""

    keys: tuple[tuple[bytes, Tenant], ...]  # (api key, tenant)
    unlisted_refresh: bool = False  # the right of clients no entry lists (no keys, or passthrough)
    operator: bytes | None = None  # the token /metrics and /detgate/status ask for, when set

    @classmethod
    def from_settings(cls, settings: Settings) -> Tenants:
        keys = tuple((config.key.get_secret_value().encode(),
                      Tenant(name, SHARED_NAMESPACE if name in settings.shared_cache_tenants else config.namespace,
                             config.refresh))
                     for name, config in settings.tenants.items())
        operator = settings.operator_token.get_secret_value().encode() if settings.operator_token else None
        return cls(keys, settings.refresh_unlisted, operator)

    def lookup(self, api_key: bytes) -> Tenant | None:
        found = None
        for key, tenant in self.keys:  # no early exit: every key is compared every time
            if hmac.compare_digest(key, api_key):
                found = tenant
        return found


def bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def authenticate(credentials: Credentials, tenants: Tenants, passthrough: bool) -> Tenant:
    """The request's tenant; raises 401 when keys are configured and this one is not among them.
    A missing or empty key never matches (Settings refuse empty keys, and none is looked up)."""
    api_key = bearer(credentials.authorization)
    if passthrough:
        if api_key is None:
            raise ApiError(401, "This gateway passes your API key on to the upstream: send one as 'Authorization: Bearer <key>'.",
                           type="invalid_request_error", code="missing_api_key")
        # The organization and project pick what answers, so they are part of whose entries these are.
        name = tenant_from_api_key(api_key, credentials.account)
        return Tenant(name, name, tenants.unlisted_refresh)
    if not tenants.keys:
        return Tenant(DEFAULT_TENANT, DEFAULT_TENANT, tenants.unlisted_refresh)
    tenant = tenants.lookup(api_key.encode()) if api_key is not None else None
    if tenant is None:
        raise ApiError(401, "Incorrect or missing gateway API key.", type="invalid_request_error", code="invalid_api_key")
    return tenant


def authorize_refresh(tenant: Tenant, control: str, key: str, metrics: Metrics) -> None:
    """no-cache replaces the answer everyone sharing the namespace is served, and no-store
    spends upstream calls outside the cache: both are rights the config grants, and every
    use or attempt is counted and logged per tenant."""
    metrics.refreshes.labels(tenant.name, control, "allowed" if tenant.refresh else "refused").inc()
    if tenant.refresh:
        log.info("tenant %r sent x-detgate-cache-control: %s for key %s", tenant.name, control, key)
    else:
        log.warning("tenant %r was refused x-detgate-cache-control: %s for key %s", tenant.name, control, key)
        raise ApiError(403, f"Tenant {tenant.name!r} may not send x-detgate-cache-control: {control}; the operator "
                            "grants it per tenant (refresh = true).",
                       type="permission_error", param="x-detgate-cache-control", code="refresh_not_allowed")


def authorize_operator(authorization: str | None, tenants: Tenants) -> bool:
    """For /metrics and /detgate/status: True for the operator's token, False when none is
    configured (the endpoint's own rule applies), else a 401."""
    if tenants.operator is None:
        return False
    if not hmac.compare_digest((bearer(authorization) or "").encode(), tenants.operator):
        raise ApiError(401, "This endpoint needs the gateway's operator token: 'Authorization: Bearer <token>'.",
                       type="invalid_request_error", code="invalid_operator_token")
    return True


def upstream_headers(upstream: UpstreamConfig, credentials: Credentials, passthrough: bool,
                     wire: str = "openai") -> tuple[tuple[str, str], ...]:
    """The credentials sent upstream, in the header `wire` takes them in: the client's own
    (key, organization, project) in passthrough mode, else the upstream's configured key
    and nothing the client chose."""
    if passthrough:
        return credential_headers(wire, bearer(credentials.authorization)) + credentials.account
    return credential_headers(wire, upstream.key())
