"""Who is asking: the tenant a request is cached under, and the credential sent upstream."""
from __future__ import annotations

import hmac
from dataclasses import dataclass

from gateway.config import Settings, UpstreamConfig
from gateway.errors import ApiError
from gateway.policy.keys import tenant_from_api_key

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Tenants:
    """Gateway API keys, compared in constant time so response timing leaks nothing about them."""

    keys: tuple[tuple[bytes, str], ...]  # (api key, tenant)

    @classmethod
    def from_settings(cls, settings: Settings) -> Tenants:
        return cls(tuple((key.get_secret_value().encode(), name) for name, key in settings.tenants.items()))

    def lookup(self, api_key: bytes) -> str | None:
        found = None
        for key, name in self.keys:  # no early exit: every key is compared every time
            if hmac.compare_digest(key, api_key):
                found = name
        return found


def bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def authenticate(header: str | None, tenants: Tenants, passthrough: bool) -> str:
    """The request's tenant; raises 401 when keys are configured and this one is not among them."""
    api_key = bearer(header)
    if passthrough:
        if api_key is None:
            raise ApiError(401, "This gateway passes your API key on to the upstream: send one as 'Authorization: Bearer <key>'.",
                           type="invalid_request_error", code="missing_api_key")
        return tenant_from_api_key(api_key)
    if not tenants.keys:
        return DEFAULT_TENANT
    tenant = tenants.lookup((api_key or "").encode())
    if tenant is None:
        raise ApiError(401, "Incorrect or missing gateway API key.", type="invalid_request_error", code="invalid_api_key")
    return tenant


def upstream_authorization(upstream: UpstreamConfig, client_header: str | None, passthrough: bool) -> str | None:
    return client_header if passthrough else upstream.authorization()
