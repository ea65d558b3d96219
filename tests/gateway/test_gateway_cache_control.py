"""x-detgate-cache-control: no-store, no-cache, only-if-cached."""
from __future__ import annotations

from gw_http import CHAT, assert_openai_error, post


def cc(value: str) -> dict[str, str]:
    return {"x-detgate-cache-control": value}


def test_only_if_cached_miss_names_the_key(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    missing = post(gw.url, "/v1/chat/completions", CHAT, cc("only-if-cached"))
    error = assert_openai_error(missing, 404, code="cache_miss")
    assert missing.key and missing.key in error["message"]
    assert fake.calls == []
    stored = post(gw.url, "/v1/chat/completions", CHAT)
    hit = post(gw.url, "/v1/chat/completions", CHAT, cc("only-if-cached"))
    assert (hit.status, hit.cache, hit.body) == (200, "hit", stored.body)


def test_no_store_neither_reads_nor_writes(upstream, gateway):
    fake, _ = upstream
    gw = gateway(refresh_unlisted=True)  # the right to bypass (test_security_refresh.py)
    stored = post(gw.url, "/v1/chat/completions", CHAT)
    bypass = [post(gw.url, "/v1/chat/completions", CHAT, cc("no-store")) for _ in range(2)]
    assert [r.cache for r in bypass] == ["bypass", "bypass"]
    assert len({stored.body, bypass[0].body, bypass[1].body}) == 3  # fresh upstream answers each time
    assert post(gw.url, "/v1/chat/completions", CHAT).body == stored.body
    streamed = post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True}, cc("no-store"))
    assert streamed.cache == "bypass" and streamed.body.endswith(b"data: [DONE]\n\n")
    assert len(fake.calls) == 4


def test_no_cache_refreshes_the_entry(upstream, gateway):
    gw = gateway(refresh_unlisted=True)  # the right to refresh (test_security_refresh.py)
    old = post(gw.url, "/v1/chat/completions", CHAT)
    fresh = post(gw.url, "/v1/chat/completions", CHAT, cc("no-cache"))
    assert fresh.cache == "miss" and fresh.body != old.body
    assert post(gw.url, "/v1/chat/completions", CHAT).body == fresh.body


def test_unknown_directive_is_a_400(upstream, gateway):
    reply = post(gateway().url, "/v1/chat/completions", CHAT, cc("maybe"))
    assert_openai_error(reply, 400, param="x-detgate-cache-control")
