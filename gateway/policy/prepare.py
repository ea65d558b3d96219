"""From request bytes to what the cache needs: tenant, upstream call and signed key.

A pure function of (surface, body bytes, the request headers that matter, policy hints,
settings), so its result can be remembered: a hot request repeated byte for byte skips
parsing, validation, canonicalization and signing, which are most of a cache hit's CPU
time.
"""
from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.apis.surface import Surface, View
from gateway.config import Settings
from gateway.errors import ApiError
from gateway.ingress.auth import Tenants, authenticate, upstream_authorization
from gateway.ingress.limits import cache_namespace, check_message_count
from gateway.policy.apply import Hints, apply_policy
from gateway.policy.canonical import CanonicalError, canonical_json
from gateway.policy.keys import KeyParts, sign
from gateway.policy.routing import route as pick_upstream
from gateway.strategies.single import Call


@dataclass(frozen=True)
class Asked:
    """What of a request's headers preparation reads, hashable for the memo."""

    authorization: str | None = None
    keyed: tuple[tuple[str, str], ...] = ()  # the surface's keyed headers that were sent, lower-cased names
    hints: Hints = Hints()


@dataclass(frozen=True)
class Prepared:
    tenant: str
    model: str
    key: str
    call: Call
    view: View  # how this request wants its answer rendered
    warnings: tuple[str, ...]
    rules: tuple[str, ...]  # canonicalization rules that fired, counted per request
    rewrites: tuple[str, ...] = ()  # parameters the policy changed, counted per request
    # n > 1 split by the profile: one (key, call) per answer, merged in order; `key` and
    # `call` above are then the joined keys and the first call.
    split: tuple[tuple[str, Call], ...] = ()


def prepare(surface: Surface, raw: bytes, asked: Asked, settings: Settings, tenants: Tenants,
            secret: bytes) -> Prepared:
    """Raises ApiError (4xx) for anything the client must fix."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    surface.validate(body)
    check_message_count(surface.message_count(body), settings.max_messages)
    tenant = authenticate(asked.authorization, tenants, settings.passthrough_auth)
    upstream, model = pick_upstream(settings.upstreams, body["model"])
    policy = apply_policy(surface, {**body, "model": model}, upstream, settings.rules, asked.hints)
    view = surface.view(body)
    authorization = upstream_authorization(upstream, asked.authorization, settings.passthrough_auth)
    headers = ((("Authorization", authorization),) if authorization else ()) + asked.keyed
    keyed = canonical_json(list(asked.keyed)) if asked.keyed else b""
    parts, rules = [], ()
    for sent in policy.bodies:
        try:
            canonical = surface.canonical(sent, True)
            signed = canonical_json(canonical.key)
        except CanonicalError as exc:
            raise ApiError(400, f"The request has no canonical form: {exc}.", param=exc.param, code="invalid_value") from None
        rules = rules or canonical.rules
        key = sign(secret, KeyParts(cache_namespace(tenant, settings), upstream.name, policy.model, surface.name,
                                    policy.spec.name, signed, keyed))
        # The parts of a split are answered whole and merged, so each is fetched unstreamed.
        stream = view.stream and len(policy.bodies) == 1
        seed = sent.get("seed")
        parts.append((key, Call(surface, upstream, surface.upstream_body(canonical.sent, stream), headers, stream,
                                policy.spec, seed if type(seed) is int else 0)))
    if len(parts) == 1:
        key, call = parts[0]
        return Prepared(tenant, policy.model, key, call, view, policy.warnings, rules, policy.rewrites)
    return Prepared(tenant, policy.model, ",".join(k for k, _ in parts), parts[0][1], view, policy.warnings, rules,
                    policy.rewrites, tuple(parts))


class PreparedMemo:
    """Recent successful preparations by (surface, asked, body bytes), oldest dropped
    first. Failures are not remembered: a bad request costs its full price every time."""

    MAX_BODY = 64 * 1024  # larger bodies are rarely repeated hot and would crowd the memo

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._memo: dict[tuple[str, Asked, bytes], Prepared] = {}

    def get(self, surface: Surface, raw: bytes, asked: Asked, settings: Settings, tenants: Tenants,
            secret: bytes) -> Prepared:
        if len(raw) > self.MAX_BODY:
            return prepare(surface, raw, asked, settings, tenants, secret)
        memo_key = (surface.name, asked, raw)
        found = self._memo.get(memo_key)
        if found is None:
            found = prepare(surface, raw, asked, settings, tenants, secret)
            if len(self._memo) >= self.size:
                del self._memo[next(iter(self._memo))]
            self._memo[memo_key] = found
        return found
