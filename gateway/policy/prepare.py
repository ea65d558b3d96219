"""From request bytes to what the cache needs: tenant, upstream call and signed key.

A pure function of (surface, body bytes, the request headers that matter, policy hints,
settings), so its result can be remembered: a hot request repeated byte for byte skips
parsing, validation, canonicalization and signing, which are most of a cache hit's CPU
time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import orjson

from gateway.apis.surface import Surface, View
from gateway.config import Settings
from gateway.errors import ApiError
from gateway.ingress.auth import (
    Credentials,
    Tenant,
    Tenants,
    authenticate,
    upstream_headers,
)
from gateway.ingress.limits import check_message_count
from gateway.policy.apply import Hints, apply_policy, text_rules
from gateway.policy import key_rules
from gateway.policy.canonical import CanonicalError, canonical_json, settled_json, text_warning
from gateway.policy.key_rules import KeyRule
from gateway.policy.keys import KeyParts, sign
from gateway.policy.routing import route as pick_upstream
from gateway.strategies.single import Call


class Asked(NamedTuple):
    """What of a request's headers preparation reads: the memo's key, with the body (a
    tuple, built and hashed on every cache hit)."""

    credentials: Credentials = Credentials()
    keyed: tuple[tuple[str, str], ...] = ()  # the surface's keyed headers that were sent, lower-cased names
    hints: Hints = Hints()
    canonical: str | None = None  # x-detgate-canonical: whether text rules apply
    agent: str | None = None  # the coding agent the user-agent names (key_rules.recognise): its key rules


@dataclass(frozen=True)
class Prepared:
    tenant: Tenant
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
    uncached: str | None = None  # why the request is passed through uncached (Surface.uncached)
    parent: str | None = None  # the id of the earlier answer it continues (Surface.parent_id)
    # What `key` is signed over, which sessions match on: kept in record and replay modes
    # only (not for a split), since the memo would hold every canonical form twice.
    parts: KeyParts | None = None
    applicable: tuple[KeyRule, ...] = ()  # the key rules it was keyed under (key_rules.applicable)


def prepare(surface: Surface, raw: bytes, asked: Asked, settings: Settings, tenants: Tenants,
            secret: bytes) -> Prepared:
    """Raises ApiError (4xx) for anything the client must fix."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    try:
        return _prepare(surface, body, asked, settings, tenants, secret)
    except RecursionError:
        # orjson reads up to 1024 levels; the walks over the body (validation, canonical
        # form, key rules) recurse per level and stop short of that.
        raise ApiError(400, "The request body nests too deeply for the gateway to read.", code="invalid_json") from None


def _prepare(surface: Surface, body, asked: Asked, settings: Settings, tenants: Tenants, secret: bytes) -> Prepared:
    surface.validate(body)
    check_message_count(surface.message_count(body), settings.max_messages)
    tenant = authenticate(asked.credentials, tenants, settings.passthrough_auth)
    upstream, model = pick_upstream(settings.upstreams, settings.rules.profiles, surface, body["model"])
    policy = apply_policy(surface, {**body, "model": model}, upstream, settings.rules, asked.hints)
    text = text_rules(asked.canonical, upstream)
    view = surface.view(body)
    sent_keyed = surface.keyed(asked.keyed)
    headers = upstream_headers(upstream, asked.credentials, settings.passthrough_auth, surface.wire) + sent_keyed
    keyed = canonical_json(list(sent_keyed)) if sent_keyed else b""
    applicable = key_rules.applicable(asked.agent, settings.mode, settings.agent_key_rules, settings.key_rules)
    parts, rules, fired = [], (), {}
    for sent in policy.bodies:
        try:
            canonical = surface.canonical(sent, text)
            tree, fired_here = key_rules.apply(canonical.key, applicable)
            signed = settled_json(tree)
        except CanonicalError as exc:
            raise ApiError(400, f"The request has no canonical form: {exc}.", param=exc.param, code="invalid_value") from None
        rules = rules or canonical.rules
        fired.update(dict.fromkeys(rule.name for rule in fired_here))
        signing = KeyParts(tenant.namespace, upstream.name, policy.model, surface.name, policy.spec.name, signed, keyed,
                           key_rules.schema(fired_here))
        key = sign(secret, signing)
        # The parts of a split are answered whole and merged, so each is fetched unstreamed.
        stream = view.stream and len(policy.bodies) == 1
        seed = sent.get("seed")
        upstream_body = {k: v for k, v in canonical.sent.items() if k not in policy.unsent}
        parts.append((key, signing, Call(surface, upstream, surface.upstream_body(upstream_body, stream), headers, stream,
                                policy.spec, seed if type(seed) is int else 0)))
    warnings = policy.warnings + tuple(filter(None, [text_warning(rules), key_rules.warning(tuple(fired))]))
    if len(parts) == 1:
        key, signing, call = parts[0]
        return Prepared(tenant, policy.model, key, call, view, warnings, rules, policy.rewrites,
                        uncached=surface.uncached(body), parent=surface.parent_id(body),
                        parts=signing if settings.mode != "normal" else None, applicable=applicable)
    return Prepared(tenant, policy.model, ",".join(k for k, _, _ in parts), parts[0][2], view, warnings, rules,
                    policy.rewrites, tuple((k, c) for k, _, c in parts), applicable=applicable)


class PreparedMemo:
    """Recent successful preparations by (surface, asked, body bytes), oldest dropped
    first. Failures are not remembered: a bad request costs its full price every time."""

    MAX_BODY = 64 * 1024  # larger bodies are rarely repeated hot and would crowd the memo

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._memo: dict[tuple[str, Asked, bytes], Prepared] = {}

    def clear(self) -> None:
        """Forget every preparation (the settings they were made under changed)."""
        self._memo.clear()

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
