"""From request bytes to what the cache needs: tenant, upstream call and signed key.

A pure function of (route, body bytes, Authorization, settings), so its result can be
remembered: a hot request repeated byte for byte skips parsing, validation,
canonicalization and signing, which are most of a cache hit's CPU time.
"""
from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.auth import Tenants, authenticate, upstream_authorization
from gateway.canonical import CanonicalError, canonical_json, canonicalize
from gateway.config import Settings
from gateway.errors import ApiError
from gateway.keys import KeyParts, sign
from gateway.policy import apply_policy
from gateway.routing import route as pick_upstream
from gateway.strategy import Call
from gateway.validation import validate

STRATEGY = "single"


@dataclass(frozen=True)
class Prepared:
    tenant: str
    model: str
    key: str
    call: Call
    warnings: tuple[str, ...]
    rules: tuple[str, ...]  # canonicalization rules that fired, counted per request


def prepare(route: str, raw: bytes, authorization: str | None, settings: Settings, tenants: Tenants,
            secret: bytes) -> Prepared:
    """Raises ApiError (4xx) for anything the client must fix."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    validate(route, body)
    tenant = authenticate(authorization, tenants, settings.passthrough_auth)
    upstream, model = pick_upstream(settings.upstreams, body["model"])
    body, warnings = apply_policy(route, {**body, "model": model}, upstream)
    try:
        canonical = canonicalize(route, body)
        signed = canonical_json(canonical.body)
    except CanonicalError as exc:
        raise ApiError(400, f"The request has no canonical form: {exc}.", param=exc.param, code="invalid_value") from None
    key = sign(secret, KeyParts(tenant, upstream.name, model, route, STRATEGY, signed))
    stream = body.get("stream") is True
    call = Call(route, upstream, upstream_body(canonical.body, body, stream),
                upstream_authorization(upstream, authorization, settings.passthrough_auth), stream)
    return Prepared(tenant, model, key, call, warnings, canonical.rules)


def upstream_body(canonical: dict, sent: dict, stream: bool) -> dict:
    """The canonical request (so the upstream answers exactly what the key stands for) plus
    the transport fields canonicalization leaves out."""
    if not stream:
        return canonical
    out = {**canonical, "stream": True}
    if sent.get("stream_options") is not None:
        out["stream_options"] = sent["stream_options"]
    return out


class PreparedMemo:
    """Recent successful preparations by (route, Authorization, body bytes), oldest dropped
    first. Failures are not remembered: a bad request costs its full price every time."""

    MAX_BODY = 64 * 1024  # larger bodies are rarely repeated hot and would crowd the memo

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._memo: dict[tuple[str, str | None, bytes], Prepared] = {}

    def get(self, route: str, raw: bytes, authorization: str | None, settings: Settings, tenants: Tenants,
            secret: bytes) -> Prepared:
        if len(raw) > self.MAX_BODY:
            return prepare(route, raw, authorization, settings, tenants, secret)
        memo_key = (route, authorization, raw)
        found = self._memo.get(memo_key)
        if found is None:
            found = prepare(route, raw, authorization, settings, tenants, secret)
            if len(self._memo) >= self.size:
                del self._memo[next(iter(self._memo))]
            self._memo[memo_key] = found
        return found
