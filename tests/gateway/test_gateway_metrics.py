"""/metrics carries the names the dashboards are built on, with the right values."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson

from gw_http import CHAT, post, samples, value


async def test_metrics_count_what_happened(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.delay_s = 1.0
    gw = gateway()
    body = {"model": "fake/m1", "messages": [{"role": "user", "content": "Cafe\u0301\r\n"}]}
    async with aiohttp.ClientSession() as session:
        async def one():
            async with session.post(gw.url + "/v1/chat/completions", data=orjson.dumps(body)) as r:
                return r.status
        assert await asyncio.gather(*(one() for _ in range(3))) == [200] * 3
    fake.behaviour.delay_s = 0
    post(gw.url, "/v1/chat/completions", body)
    post(gw.url, "/v1/chat/completions", {"model": 1})
    m = samples(gw.url)
    chat = {"route": "chat.completions", "model": "m1"}
    assert value(m, "detgate_requests_total", **chat, cache="miss", code="200") == 1
    assert value(m, "detgate_requests_total", **chat, cache="coalesced", code="200") == 2
    assert value(m, "detgate_requests_total", **chat, cache="hit", code="200") == 1
    assert value(m, "detgate_requests_total", route="chat.completions", model="", cache="bypass", code="400") == 1
    assert value(m, "detgate_coalesced_total", route="chat.completions") == 2
    assert value(m, "detgate_upstream_requests_total", upstream="fake", code="200") == 1
    assert value(m, "detgate_upstream_duration_seconds_count", upstream="fake") == 1
    assert value(m, "detgate_request_duration_seconds_count", route="chat.completions", cache="hit") == 1
    # Each of the 4 valid requests was canonicalized once: "e" + U+0301 composed, CRLF made LF.
    assert value(m, "detgate_canonical_rules_total", rule="nfc") == 4
    assert value(m, "detgate_canonical_rules_total", rule="crlf") == 4
    assert value(m, "detgate_cache_entries_bytes") > 0
    assert value(m, "detgate_inflight_requests") == 1  # the scrape itself
    assert value(m, "detgate_cache_errors_total", op="get") == 0


def test_a_store_outage_is_counted_and_served_uncached(upstream, gateway, own_redis):
    fake, _ = upstream
    gw = gateway(redis_url=own_redis.url)
    own_redis.stop()
    replies = [post(gw.url, "/v1/chat/completions", CHAT) for _ in range(2)]
    assert [r.status for r in replies] == [200, 200]
    assert len(fake.calls) == 2
    m = samples(gw.url)
    assert value(m, "detgate_cache_errors_total", op="get") == 2


def test_one_json_access_line_per_request(upstream, gateway_process):
    _, url = upstream
    gw = gateway_process(["--upstream", f"fake={url}", "--log-level", "INFO"])
    post(gw.url, "/v1/chat/completions", CHAT)
    post(gw.url, "/v1/chat/completions", CHAT)
    post(gw.url, "/v1/chat/completions", {"model": 2})
    gw.stop()
    lines = [orjson.loads(line) for line in gw.process.stderr.read().splitlines()]
    access = [line for line in lines if line["logger"] == "detgate.access" and line["route"] == "chat.completions"]
    assert [(a["status"], a["cache"]) for a in access] == [(200, "miss"), (200, "hit"), (400, "bypass")]
    assert access[0]["key"] == access[1]["key"] and access[0]["model"] == "m1" and access[0]["tenant"] == "default"
