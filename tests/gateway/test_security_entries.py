"""Stored entries cannot be forged or moved: each carries a MAC over its key and value
under the gateway's secret. An altered entry, one copied under another tenant's key, or
one sealed by a gateway with another secret is a miss, counted, and refilled."""
from __future__ import annotations

import hmac

import pytest
import redis

from gateway.ingress.auth import Tenant, Tenants
from gateway.cache.redis_store import entry_name
from gw_http import CHAT, post, samples, value

KEYS = {"acme": "gw-key-acme", "globex": "gw-key-globex"}
ONLY_CACHED = {"x-detgate-cache-control": "only-if-cached"}


def auth(tenant: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", **more}


@pytest.fixture
def raw_redis(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_an_entry_copied_under_another_tenants_key_is_not_served(upstream, gateway, redis_url, raw_redis):
    fake, _ = upstream
    gw = gateway(tenants=KEYS, redis_url=redis_url, near_cache_ttl_s=0)
    acme = post(gw.url, "/v1/chat/completions", CHAT, auth("acme"))
    globex = post(gw.url, "/v1/chat/completions", CHAT, auth("globex"))
    assert acme.key != globex.key and acme.body != globex.body
    # Someone with write access to Redis gives globex acme's answer.
    raw_redis.set(entry_name(globex.key), raw_redis.get(entry_name(acme.key)))
    assert post(gw.url, "/v1/chat/completions", CHAT, auth("globex", **ONLY_CACHED)).status == 404
    refilled = post(gw.url, "/v1/chat/completions", CHAT, auth("globex"))
    assert refilled.cache == "miss" and refilled.body != acme.body
    assert value(samples(gw.url), "detgate_cache_tamper_total") == 2
    assert len(fake.calls) == 3


def test_an_entry_sealed_under_another_secret_is_a_counted_miss(upstream, gateway, redis_url, raw_redis):
    theirs = gateway(redis_url=redis_url, secret="another-deployments-secret", near_cache_ttl_s=0)
    ours = gateway(redis_url=redis_url, near_cache_ttl_s=0)
    planted = post(theirs.url, "/v1/chat/completions", CHAT)
    key = post(ours.url, "/v1/chat/completions", CHAT, headers=ONLY_CACHED).key
    assert planted.key != key  # the secret signs keys too, so the two never meet by accident...
    raw_redis.set(entry_name(key), raw_redis.get(entry_name(planted.key)))  # ...only by a planted copy
    mine = post(ours.url, "/v1/chat/completions", CHAT)
    assert mine.cache == "miss" and mine.body != planted.body
    assert value(samples(ours.url), "detgate_cache_tamper_total") == 1


def test_a_value_edited_in_place_is_counted_as_tampering(upstream, gateway, redis_url, raw_redis):
    gw = gateway(redis_url=redis_url, near_cache_ttl_s=0)
    stored = post(gw.url, "/v1/chat/completions", CHAT)
    name = entry_name(stored.key)
    raw_redis.set(name, raw_redis.get(name).replace(b"fake-0001", b"fake-0002"))
    assert post(gw.url, "/v1/chat/completions", CHAT, headers=ONLY_CACHED).status == 404
    assert value(samples(gw.url), "detgate_cache_tamper_total") == 1


def test_gateway_keys_are_compared_in_constant_time_against_every_key(monkeypatch):
    tenants = Tenants(tuple((f"key-{i}".encode(), Tenant(f"t{i}", f"t{i}")) for i in range(5)))
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr("gateway.ingress.auth.hmac.compare_digest", spy)
    assert tenants.lookup(b"key-0").name == "t0"
    assert tenants.lookup(b"key-9") is None
    assert len(compared) == 10  # no early exit on a match: timing says nothing about which key
