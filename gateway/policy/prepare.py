"""From request bytes to what the cache needs: tenant, upstream call and signed key.

A pure function of (route, body bytes, Authorization, policy hints, settings), so its result can be
remembered: a hot request repeated byte for byte skips parsing, validation,
canonicalization and signing, which are most of a cache hit's CPU time.
"""
from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.ingress.auth import Tenants, authenticate, upstream_authorization
from gateway.policy.canonical import CanonicalError, canonical_json, canonicalize
from gateway.config import Settings
from gateway.errors import ApiError
from gateway.policy.keys import KeyParts, sign
from gateway.ingress.limits import cache_namespace, check_message_count
from gateway.policy.apply import Hints, apply_policy
from gateway.policy.routing import route as pick_upstream
from gateway.strategies.single import Call
from gateway.validation import validate


@dataclass(frozen=True)
class Prepared:
    tenant: str
    model: str
    key: str
    call: Call
    warnings: tuple[str, ...]
    rules: tuple[str, ...]  # canonicalization rules that fired, counted per request
    rewrites: tuple[str, ...] = ()  # parameters the policy changed, counted per request
    # n > 1 split by the profile: one (key, call) per answer, merged in order; `key` and
    # `call` above are then the joined keys and the first call.
    split: tuple[tuple[str, Call], ...] = ()


def prepare(route: str, raw: bytes, authorization: str | None, hints: Hints, settings: Settings, tenants: Tenants,
            secret: bytes) -> Prepared:
    """Raises ApiError (4xx) for anything the client must fix."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    validate(route, body)
    check_message_count(route, body, settings.max_messages)
    tenant = authenticate(authorization, tenants, settings.passthrough_auth)
    upstream, model = pick_upstream(settings.upstreams, body["model"])
    policy = apply_policy(route, {**body, "model": model}, upstream, settings.rules, hints)
    stream = body.get("stream") is True
    auth = upstream_authorization(upstream, authorization, settings.passthrough_auth)
    parts, rules = [], ()
    for sent in policy.bodies:
        try:
            canonical = canonicalize(route, sent)
            signed = canonical_json(canonical.body)
        except CanonicalError as exc:
            raise ApiError(400, f"The request has no canonical form: {exc}.", param=exc.param, code="invalid_value") from None
        rules = rules or canonical.rules
        key = sign(secret, KeyParts(cache_namespace(tenant, settings), upstream.name, policy.model, route,
                                    policy.spec.name, signed))
        # The parts of a split are answered whole and merged, so each is fetched unstreamed.
        part_stream = stream and len(policy.bodies) == 1
        parts.append((key, Call(route, upstream, upstream_body(canonical.body, sent, part_stream), auth, part_stream,
                                policy.spec)))
    if len(parts) == 1:
        key, call = parts[0]
        return Prepared(tenant, policy.model, key, call, policy.warnings, rules, policy.rewrites)
    call = Call(route, upstream, parts[0][1].body, auth, stream, policy.spec)
    return Prepared(tenant, policy.model, ",".join(k for k, _ in parts), call, policy.warnings, rules,
                    policy.rewrites, tuple(parts))


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
        self._memo: dict[tuple[str, str | None, Hints, bytes], Prepared] = {}

    def get(self, route: str, raw: bytes, authorization: str | None, hints: Hints, settings: Settings,
            tenants: Tenants, secret: bytes) -> Prepared:
        if len(raw) > self.MAX_BODY:
            return prepare(route, raw, authorization, hints, settings, tenants, secret)
        memo_key = (route, authorization, hints, raw)
        found = self._memo.get(memo_key)
        if found is None:
            found = prepare(route, raw, authorization, hints, settings, tenants, secret)
            if len(self._memo) >= self.size:
                del self._memo[next(iter(self._memo))]
            self._memo[memo_key] = found
        return found
