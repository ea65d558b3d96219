"""Refresh is an authority: x-detgate-cache-control no-cache replaces the answer everyone
in a namespace is served, and no-store spends upstream calls outside the cache. Only
tenants the config gives the right may send them; every use and refusal is counted and
logged per tenant. only-if-cached stays everyone's, and `--mode record` the operator's."""
from __future__ import annotations

import logging

import openai
import pytest

from gw_http import CHAT, assert_openai_error, post, samples, value

KEYS = {"acme": {"key": "gw-key-acme", "refresh": True}, "globex": "gw-key-globex"}
MESSAGES = CHAT["messages"]


def as_(gw, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def control(value: str) -> dict:
    return {"extra_headers": {"x-detgate-cache-control": value}}


def test_a_tenant_without_the_right_cannot_reroll_a_shared_answer(upstream, gateway, caplog):
    fake, _ = upstream
    caplog.set_level(logging.INFO, logger="detgate")
    gw = gateway(tenants=KEYS, shared_cache_tenants=["acme", "globex"])
    acme, globex = as_(gw, "gw-key-acme"), as_(gw, "gw-key-globex")
    served = acme.chat.completions.create(model="fake/m1", messages=MESSAGES)
    for directive in ("no-cache", "no-store", "no-cache", "No-Cache"):
        with pytest.raises(openai.PermissionDeniedError) as caught:
            globex.chat.completions.create(model="fake/m1", messages=MESSAGES, **control(directive))
        assert caught.value.code == "refresh_not_allowed" and "globex" in caught.value.message
    assert len(fake.calls) == 1
    assert globex.chat.completions.create(model="fake/m1", messages=MESSAGES) == served

    refreshed = acme.chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES, **control("no-cache"))
    assert refreshed.headers["x-detgate-cache"] == "miss" and refreshed.parse() != served
    assert globex.chat.completions.create(model="fake/m1", messages=MESSAGES) == refreshed.parse()
    bypassed = acme.chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES, **control("no-store"))
    assert bypassed.headers["x-detgate-cache"] == "bypass"
    assert len(fake.calls) == 3

    metrics = samples(gw.url)
    counted = {(t, c, o): value(metrics, "detgate_refreshes_total", tenant=t, control=c, outcome=o)
               for t in ("acme", "globex") for c in ("no-cache", "no-store") for o in ("allowed", "refused")}
    assert {k: v for k, v in counted.items() if v} == {
        ("globex", "no-cache", "refused"): 3, ("globex", "no-store", "refused"): 1,
        ("acme", "no-cache", "allowed"): 1, ("acme", "no-store", "allowed"): 1}
    logged = [r.getMessage() for r in caplog.records if "x-detgate-cache-control" in r.getMessage()]
    assert len(logged) == 6 and sum("'globex' was refused" in m for m in logged) == 4
    assert all(refreshed.headers["x-detgate-key"] in m for m in logged)


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {**CHAT, "stream": True}),
    ("/v1/completions", {"model": "fake/m1", "prompt": "p"}),
    ("/v1/embeddings", {"model": "fake/m1", "input": "e"}),
])
def test_every_route_refuses_in_its_own_shape_before_any_upstream_call(upstream, gateway, route, body):
    fake, _ = upstream
    gw = gateway(tenants=KEYS)
    reply = post(gw.url, route, body, {"Authorization": "Bearer gw-key-globex", "x-detgate-cache-control": "no-cache"})
    assert_openai_error(reply, 403, param="x-detgate-cache-control", code="refresh_not_allowed")
    assert fake.calls == []


@pytest.mark.parametrize("settings", [{}, {"passthrough_auth": True}])
def test_unlisted_clients_have_the_right_only_when_the_operator_grants_it(upstream, gateway, settings):
    fake, _ = upstream
    closed, opened = gateway(**settings), gateway(refresh_unlisted=True, **settings)
    headers = {"Authorization": "Bearer sk-client", "x-detgate-cache-control": "no-cache"}
    assert_openai_error(post(closed.url, "/v1/chat/completions", CHAT, headers), 403, code="refresh_not_allowed")
    assert post(opened.url, "/v1/chat/completions", CHAT, headers).cache == "miss"
    only = post(closed.url, "/v1/chat/completions", CHAT, {**headers, "x-detgate-cache-control": "only-if-cached"})
    assert only.status == 404 and only.json()["error"]["code"] == "cache_miss"  # reading is everyone's
    assert len(fake.calls) == 1


def test_record_mode_is_the_operators_and_refreshes_for_every_tenant(upstream, gateway, redis_url):
    fake, _ = upstream
    shared = {"tenants": KEYS, "redis_url": redis_url, "near_cache_ttl_s": 0}
    normal, record = gateway(**shared), gateway(mode="record", **shared)
    globex = {"Authorization": "Bearer gw-key-globex"}
    old = post(normal.url, "/v1/chat/completions", CHAT, globex)
    recorded = post(record.url, "/v1/chat/completions", CHAT, globex)
    assert recorded.cache == "miss" and recorded.body != old.body
    assert post(normal.url, "/v1/chat/completions", CHAT, globex).body == recorded.body
    assert len(fake.calls) == 2
