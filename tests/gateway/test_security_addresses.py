"""Errors never show internal addresses. An unreachable upstream, one that never answers,
an open circuit, a canary that cannot reach its upstream and a Redis that is down each
reach the client (or /detgate/status) in the gateway's words; the host and port that
the connector named are in the log only."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest
from aiohttp import web

from fakes.loopback import LoopbackServer, free_port
from gw_http import CHAT, Reply, get, post


def assert_no_address(reply: Reply, *ports: int) -> None:
    shown = reply.body + str(reply.headers).encode()
    for port in ports:
        assert f":{port}".encode() not in shown, shown
    assert b"127.0.0.1" not in shown and b"localhost" not in shown, shown


@pytest.fixture
def dead_port() -> int:
    """A loopback port nothing listens on: every connection is refused."""
    return free_port()


def requests_to(model: str) -> list[tuple[str, str, object]]:
    chat = {**CHAT, "model": model}
    return [("POST", "/v1/chat/completions", chat), ("POST", "/v1/chat/completions", {**chat, "stream": True}),
            ("POST", "/v1/completions", {"model": model, "prompt": "p"}),
            ("POST", "/v1/embeddings", {"model": model, "input": "e"}), ("GET", "/v1/models", None)]


def send(gw, method: str, path: str, body) -> Reply:
    return post(gw.url, path, body) if method == "POST" else get(gw.url, path)


def test_an_unreachable_upstream_is_named_not_located(gateway, dead_port, caplog):
    caplog.set_level(logging.WARNING, logger="detgate")
    gw = gateway(upstreams=[f"dead=http://127.0.0.1:{dead_port}/v1"], upstream_max_attempts=2, breaker_failures=0)
    for method, path, body in requests_to("dead/m1"):
        reply = send(gw, method, path, body)
        assert reply.status == 502, (path, reply.body)
        assert b"upstream 'dead' could not be reached" in reply.body
        assert_no_address(reply, dead_port)
    assert str(dead_port) in caplog.text  # the operator still learns where it failed


@pytest.fixture
def silent():
    """An upstream that accepts every call and never answers."""
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    with LoopbackServer(app) as server:
        yield server


def test_an_upstream_that_never_answers_times_out_without_its_address(gateway, silent):
    port = int(silent.url.rsplit(":", 1)[1])
    gw = gateway(upstreams=[f"slow={silent.url}/v1"], upstream_timeout_s=0.5, upstream_idle_timeout_s=0.3,
                 upstream_max_attempts=1, breaker_failures=0)
    for method, path, body in requests_to("slow/m1"):
        reply = send(gw, method, path, body)
        assert reply.status in (502, 504), (path, reply.body)
        assert_no_address(reply, port)


def test_an_open_circuit_is_named_not_located(gateway, dead_port):
    gw = gateway(upstreams=[f"dead=http://127.0.0.1:{dead_port}/v1"], upstream_max_attempts=1, breaker_failures=1,
                 breaker_open_s=30)
    first = post(gw.url, "/v1/chat/completions", {**CHAT, "model": "dead/m1"})
    tripped = post(gw.url, "/v1/chat/completions", {**CHAT, "model": "dead/m1", "seed": 2})
    assert (first.status, tripped.status) == (502, 503) and tripped.json()["error"]["code"] == "circuit_open"
    assert_no_address(first, dead_port)
    assert_no_address(tripped, dead_port)


def test_a_canary_that_cannot_reach_its_upstream_shows_no_address(gateway, dead_port):
    canary = {"name": "c1", "model": "dead/m1", "body": {"messages": CHAT["messages"]}}
    gw = gateway(upstreams=[f"dead=http://127.0.0.1:{dead_port}/v1"], canaries=[canary], canary_interval_s=0.1,
                 upstream_max_attempts=1, breaker_failures=0)
    deadline = time.monotonic() + 20
    while (status := get(gw.url, "/detgate/status")).json()["canaries"][0]["result"] != "error":
        assert time.monotonic() < deadline, status.body
        time.sleep(0.1)
    assert "could not be reached" in status.json()["canaries"][0]["error"]
    assert_no_address(status, dead_port)


def test_a_store_that_is_down_is_named_not_located(upstream, gateway, own_redis):
    redis_port = own_redis.port
    open_ = gateway(redis_url=own_redis.url, near_cache_ttl_s=0)
    closed = gateway(redis_url=own_redis.url, near_cache_ttl_s=0, cache_failure="fail-closed")
    own_redis.stop()
    status = get(open_.url, "/detgate/status")
    assert status.status == 200 and status.json()["store"]["healthy"] is False
    refused = post(closed.url, "/v1/chat/completions", CHAT)
    assert refused.status == 503 and refused.json()["error"]["code"] == "cache_unavailable"
    bypassed = post(open_.url, "/v1/chat/completions", CHAT)
    assert bypassed.status == 200 and bypassed.cache == "bypass"
    for reply in (status, refused, bypassed):
        assert_no_address(reply, redis_port)
