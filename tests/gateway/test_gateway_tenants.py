"""Tenants: gateway keys pick the tenant, and tenants never share entries."""
from __future__ import annotations

from gw_http import CHAT, assert_openai_error, post

TENANTS = {"acme": "gw-key-acme", "globex": "gw-key-globex"}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_tenants_are_isolated(upstream, gateway):
    fake, _ = upstream
    gw = gateway(tenants=TENANTS)
    acme = [post(gw.url, "/v1/chat/completions", CHAT, auth("gw-key-acme")) for _ in range(2)]
    globex = post(gw.url, "/v1/chat/completions", CHAT, auth("gw-key-globex"))
    assert [r.cache for r in acme] == ["miss", "hit"]
    assert globex.cache == "miss" and globex.key != acme[0].key and globex.body != acme[0].body
    assert len(fake.calls) == 2
    # The gateway key is ours: it never reaches the upstream.
    only = post(gw.url, "/v1/chat/completions", CHAT, {**auth("gw-key-globex"), "x-detgate-cache-control": "only-if-cached"})
    assert only.body == globex.body


def test_unknown_or_missing_key_is_a_401(upstream, gateway):
    fake, _ = upstream
    gw = gateway(tenants=TENANTS)
    assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT, auth("gw-key-acmf")), 401, code="invalid_api_key")
    assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT), 401, code="invalid_api_key")
    assert fake.calls == []


def test_passthrough_forwards_the_client_key_and_splits_tenants_by_it(upstream, gateway):
    fake, _ = upstream
    gw = gateway(passthrough_auth=True)
    a = post(gw.url, "/v1/chat/completions", CHAT, auth("sk-client-a"))
    b = post(gw.url, "/v1/chat/completions", CHAT, auth("sk-client-b"))
    a2 = post(gw.url, "/v1/chat/completions", CHAT, auth("sk-client-a"))
    assert (a.cache, b.cache, a2.cache) == ("miss", "miss", "hit")
    assert a.key != b.key
    echoed = post(gw.url, "/v1/echo/x", b"{}", auth("sk-client-a")).json()
    assert echoed["authorization"] == "Bearer sk-client-a"
    assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT), 401, code="missing_api_key")


def test_configured_upstream_key_is_sent(upstream, gateway, monkeypatch):
    _, url = upstream
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-from-env")
    gw = gateway(upstreams=[{"name": "fake", "url": url, "api_key_env": "FAKE_UPSTREAM_KEY"}])
    assert post(gw.url, "/v1/echo/x", b"{}", auth("client-key")).json()["authorization"] == "Bearer sk-from-env"
