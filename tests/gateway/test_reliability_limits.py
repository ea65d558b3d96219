"""Request limits: message count (400) and per-tenant rate limits (429 with
Retry-After), local to a replica or shared by all of them through Redis."""
from __future__ import annotations

import pytest

from gw_http import CHAT, SECRET, post, samples, value

KEYS = {"alice": "sk-alice-0001", "bob": "sk-bob-0002"}


def as_(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def test_too_many_messages_is_a_400_before_any_upstream_call(upstream, gateway):
    fake, _ = upstream
    gw = gateway(max_messages=3)
    many = {**CHAT, "messages": [{"role": "user", "content": str(i)} for i in range(4)]}
    reply = post(gw.url, "/v1/chat/completions", many)
    assert reply.status == 400
    assert reply.json()["error"] | {"message": ""} == {"message": "", "type": "invalid_request_error",
                                                        "param": "messages", "code": "too_many_messages"}
    assert post(gw.url, "/v1/chat/completions", {**many, "messages": many["messages"][:3]}).status == 200
    assert len(fake.calls) == 1


def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_others_do_not(upstream, gateway):
    gw = gateway(tenants=KEYS, rate_limits={"alice": "0.5/2", "*": "100/100"})
    alice = [post(gw.url, "/v1/chat/completions", CHAT, headers=as_("alice")) for _ in range(3)]
    assert [r.status for r in alice] == [200, 200, 429]  # hits count too: the limit is on requests
    error = alice[2].json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert int(alice[2].headers["retry-after"]) == 2  # 1 token at 0.5/s, rounded up
    assert [post(gw.url, "/v1/chat/completions", CHAT, headers=as_("bob")).status for _ in range(3)] == [200] * 3
    m = samples(gw.url)
    assert value(m, "detgate_rate_limited_total", tenant="alice") == 1
    assert value(m, "detgate_rate_limited_total", tenant="bob") == 0


def test_replicas_on_one_redis_share_a_tenants_bucket(upstream, gateway, redis_url):
    settings = dict(tenants=KEYS, rate_limits={"alice": "0.1/3"}, redis_url=redis_url, secret=SECRET)
    a, b = gateway(**settings), gateway(**settings)
    statuses = [post(gw.url, "/v1/chat/completions", CHAT, headers=as_("alice")).status for gw in (a, b, a, b)]
    assert statuses == [200, 200, 200, 429]


@pytest.mark.parametrize("spec", ["fast", "0/1", "1/0", "-1/5", "inf/1"])
def test_a_bad_rate_limit_is_refused_with_its_tenant_named(spec):
    from pydantic import ValidationError

    from gateway.config import Settings
    with pytest.raises(ValidationError, match="carol"):
        Settings(rate_limits={"carol": spec})
