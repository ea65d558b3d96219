"""Upstream faults through a real gateway: retries, Retry-After, the circuit breaker,
concurrency slots, and streams that stall or break. Nothing that failed is ever stored."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from gw_http import CHAT, post, samples, sse_payloads, value

ONLY_CACHED = {"x-detgate-cache-control": "only-if-cached"}


def error_of(reply) -> dict:
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_5xx_and_429_are_retried_and_the_retries_counted(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.fail_status, fake.behaviour.fail_times = 503, 2
    gw = gateway(upstream_max_attempts=3)
    reply = post(gw.url, "/v1/chat/completions", CHAT)
    assert (reply.status, reply.cache) == (200, "miss")
    assert fake.started == 3
    fake.behaviour.fail_status, fake.behaviour.fail_times = 429, 1
    assert post(gw.url, "/v1/completions", {"model": "fake/m1", "prompt": "x"}).status == 200
    m = samples(gw.url)
    assert value(m, "detgate_upstream_retries_total", upstream="fake", reason="5xx") == 2
    assert value(m, "detgate_upstream_retries_total", upstream="fake", reason="429") == 1


def test_a_client_error_is_not_retried_and_retries_give_up_with_the_upstreams_error(upstream, gateway):
    fake, _ = upstream
    gw = gateway(upstream_max_attempts=3)
    fake.behaviour.fail_status, fake.behaviour.fail_times = 400, 5
    assert post(gw.url, "/v1/chat/completions", CHAT).status == 400
    assert fake.started == 1
    fake.reset()
    fake.behaviour.fail_status = 500
    failed = post(gw.url, "/v1/chat/completions", CHAT)
    assert failed.status == 500 and error_of(failed)["code"] == "fake"  # the last attempt's own body
    assert fake.started == 3
    assert post(gw.url, "/v1/chat/completions", CHAT, headers=ONLY_CACHED).status == 404  # nothing stored


async def test_retry_after_is_honoured(upstream, gateway):
    fake, _ = upstream
    gw = gateway(upstream_max_attempts=2)
    fake.behaviour.fail_status, fake.behaviour.fail_times = 429, 1
    fake.behaviour.retry_after = "1"
    started = time.monotonic()
    reply = await asyncio.to_thread(post, gw.url, "/v1/chat/completions", CHAT)
    assert reply.status == 200 and time.monotonic() - started >= 1.0


def test_retries_stop_at_the_calls_deadline(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.fail_status = 429
    fake.behaviour.retry_after = "5"  # longer than what is left of the deadline: give up now
    gw = gateway(upstream_max_attempts=5, upstream_timeout_s=2)
    started = time.monotonic()
    reply = post(gw.url, "/v1/chat/completions", CHAT)
    assert reply.status == 429 and time.monotonic() - started < 1.5
    assert fake.started == 1


def test_a_hung_upstream_times_out_at_the_deadline_with_a_504(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.delay_s = 30
    gw = gateway(upstream_timeout_s=1.0, upstream_max_attempts=3)
    started = time.monotonic()
    reply = post(gw.url, "/v1/chat/completions", CHAT)
    assert reply.status == 504 and error_of(reply)["code"] == "upstream_unreachable"
    assert time.monotonic() - started < 3


def test_the_circuit_opens_after_repeated_failures_and_answers_503_fast(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.fail_status = 500
    gw = gateway(upstream_max_attempts=1, breaker_failures=3, breaker_open_s=1.0)
    for i in range(3):
        assert post(gw.url, "/v1/chat/completions", {**CHAT, "seed": i}).status == 500
    refused = post(gw.url, "/v1/chat/completions", CHAT)
    assert refused.status == 503 and error_of(refused)["code"] == "circuit_open"
    assert int(refused.headers["retry-after"]) >= 1
    assert fake.started == 3  # the open circuit did not call the upstream
    assert value(samples(gw.url), "detgate_circuit_open", upstream="fake") == 1
    fake.behaviour.fail_status = None
    time.sleep(1.1)
    assert post(gw.url, "/v1/chat/completions", CHAT).status == 200  # the probe succeeds and closes it
    assert value(samples(gw.url), "detgate_circuit_open", upstream="fake") == 0


async def test_calls_past_the_concurrency_cap_and_its_queue_get_429(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.delay_s = 1.0
    gw = gateway(upstream_concurrency=2, upstream_queue=1, upstream_queue_timeout_s=5)
    async with aiohttp.ClientSession() as session:
        async def one(i):
            body = orjson.dumps({**CHAT, "seed": i})
            async with session.post(gw.url + "/v1/chat/completions", data=body) as r:
                return r.status, r.headers.get("retry-after"), await r.read()
        replies = await asyncio.gather(*(one(i) for i in range(5)))
    statuses = sorted(s for s, _, _ in replies)
    assert statuses == [200, 200, 200, 429, 429]  # two in flight, one queued, two refused
    for status, retry_after, body in replies:
        if status == 429:
            assert orjson.loads(body)["error"]["code"] == "upstream_saturated" and int(retry_after) >= 1
    assert fake.started == 3
    assert value(samples(gw.url), "detgate_upstream_saturated_total", upstream="fake", why="queue_full") == 2


def test_a_stream_is_retried_while_nothing_was_sent(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.fail_status, fake.behaviour.fail_times = 502, 1
    gw = gateway(upstream_max_attempts=2)
    reply = post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True})
    assert reply.status == 200 and sse_payloads(reply.body)[-1] == b"[DONE]"
    assert fake.started == 2


def test_a_stream_that_breaks_after_its_first_event_is_not_retried_nor_stored(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.break_stream_after = 4
    gw = gateway(upstream_max_attempts=3)
    events = sse_payloads(post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True}).body)
    assert events[-1] != b"[DONE]" and orjson.loads(events[-1])["error"]["code"] == "upstream_stream_broken"
    assert fake.started == 1  # the client already had events: a retry would have sent them twice
    assert post(gw.url, "/v1/chat/completions", CHAT, headers=ONLY_CACHED).status == 404


def test_a_stream_that_stalls_ends_with_an_error_event_after_the_idle_timeout(upstream, gateway):
    fake, _ = upstream
    gw = gateway(upstream_idle_timeout_s=0.5)
    fake.behaviour.stall_stream_after = 3
    started = time.monotonic()
    events = sse_payloads(post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True}).body)
    assert time.monotonic() - started < 5
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_stream_broken"
    assert post(gw.url, "/v1/chat/completions", CHAT, headers=ONLY_CACHED).status == 404
