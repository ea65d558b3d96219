"""Signed cache keys and cache-entry MACs.

A key is HMAC-SHA256, under the gateway's secret, of an unambiguous encoding of
everything that decides an answer (`KeyParts`). A client controls most of those bytes,
so the hash must resist crafted collisions: xxhash would not. The encoding puts a
domain tag and KEY_SCHEMA_VERSION first and length-prefixes every field, so no two
distinct KeyParts encode to the same bytes (a tenant "a" with upstream "bc" is not
tenant "ab" with upstream "c"). Nothing in it depends on the process, so keys are the
same across restarts and replicas for the same secret.

Bump KEY_SCHEMA_VERSION whenever the canonical form or this encoding changes meaning:
every key changes with it, and old entries are never served under new rules.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

# 3: tool outputs keyed as sent (no text rules), client bookkeeping ids and cache_control
# out of the key, the key rules that fired signed in (KeyParts.rules).
KEY_SCHEMA_VERSION = 3

KEY_PREFIX = f"dg{KEY_SCHEMA_VERSION}:"

# Domain tags keep a key, an entry MAC and a tenant digest from ever being the same
# computation over the same bytes.
_KEY_DOMAIN = b"detgate/key"
_ENTRY_DOMAIN = b"detgate/entry"
_TENANT_DOMAIN = b"detgate/tenant"
_ACCOUNT_DOMAIN = b"detgate/tenant+account"
_CHAIN_DOMAIN = b"detgate/chain"


@dataclass(frozen=True)
class KeyParts:
    tenant: str
    upstream: str
    model: str          # the pinned model version
    route: str
    strategy: str       # "single", "vote:3", "schema:3", ...
    canonical: bytes    # canonical_json(Canonical.key): params and seed included
    headers: bytes = b""  # canonical_json of the request headers that change the answer (anthropic-version, ...)
    rules: bytes = b""  # the key rules that fired, whole (gateway/policy/key_rules.py: schema); b"" for none


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def encode(parts: KeyParts) -> bytes:
    """The bytes a key is signed over: domain, version, then each field length-prefixed."""
    fields = (parts.tenant, parts.upstream, parts.model, parts.route, parts.strategy)
    out = _field(_KEY_DOMAIN) + KEY_SCHEMA_VERSION.to_bytes(4, "big")
    for text in fields:
        out += _field(text.encode("utf-8", "surrogatepass"))
    return out + _field(bytes(parts.canonical)) + _field(bytes(parts.headers)) + _field(bytes(parts.rules))


def _check_secret(secret: bytes) -> None:
    if not secret:
        raise ValueError("the signing secret must not be empty")


def sign(secret: bytes, parts: KeyParts) -> str:
    """The cache key for `parts`: KEY_PREFIX ("dg3:") and 64 hex digits, safe as a Redis key and header."""
    _check_secret(secret)
    return KEY_PREFIX + hmac.new(secret, encode(parts), hashlib.sha256).hexdigest()


def chained(secret: bytes, key: str, parent: str) -> str:
    """The key of a request that continues an earlier answer (state the upstream keeps):
    its own key bound to the key that answer is stored under, so each turn of a chain is
    keyed on every turn before it."""
    _check_secret(secret)
    message = (_field(_CHAIN_DOMAIN) + KEY_SCHEMA_VERSION.to_bytes(4, "big") + _field(key.encode())
               + _field(parent.encode()))
    return KEY_PREFIX + hmac.new(secret, message, hashlib.sha256).hexdigest()


def tenant_from_api_key(api_key: str, account: tuple[tuple[str, str], ...] = ()) -> str:
    """A one-way digest of an API key, and of the organization/project headers sent with it:
    a passthrough client's tenant, and the namespace of a configured tenant given no id.

    Unkeyed on purpose: it must not change when the gateway's secret is rotated, and API
    keys carry enough entropy that the digest cannot be inverted by guessing. A key sent
    alone digests as it always has, so adding the account left existing namespaces as they were.
    """
    if account:
        message = _field(_ACCOUNT_DOMAIN) + _field(api_key.encode("utf-8", "surrogatepass"))
        for name, value in account:
            message += _field(name.encode()) + _field(value.encode("utf-8", "surrogatepass"))
    else:
        message = _field(_TENANT_DOMAIN) + api_key.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(message).hexdigest()
    return "key-" + digest[:32]


def _entry_message(key: str, value: bytes) -> bytes:
    return _field(_ENTRY_DOMAIN) + _field(key.encode("utf-8", "surrogatepass")) + bytes(value)


def entry_mac(secret: bytes, key: str, value: bytes) -> str:
    """A MAC binding a stored value to its key, so an entry altered in the store, or
    copied under another key, is detected on read."""
    _check_secret(secret)
    return hmac.new(secret, _entry_message(key, value), hashlib.sha256).hexdigest()


def verify_entry(secret: bytes, key: str, value: bytes, mac: str) -> bool:
    """Whether `mac` is entry_mac(secret, key, value); constant-time, False for any
    malformed mac rather than an exception."""
    if not isinstance(mac, str):
        return False
    expected = entry_mac(secret, key, value).encode("ascii")
    return hmac.compare_digest(expected, mac.encode("utf-8", "surrogatepass"))
