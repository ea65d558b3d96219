"""/healthz says the gateway is alive, /readyz whether it can answer: the store (under the
fail-open/closed policy) and at least one usable upstream. Real redis-server processes (killed,
or asking for a password the gateway does not have), a fake provider failing until the
circuit opens, an upstream whose key variable is unset."""
from __future__ import annotations

from gw_http import CHAT, client, get, post, samples, value
import socket
import subprocess
import time

from fakes.loopback import free_port


def ready(gw) -> tuple[int, dict]:
    reply = get(gw.url, "/readyz")
    return reply.status, reply.json()


def test_ready_with_the_in_process_store(gateway):
    gw = gateway()
    status, body = ready(gw)
    assert status == 200 and body["ready"] and not body["degraded"]
    assert body["store"] == {"kind": "in-process", "healthy": True, "error": None, "policy": "fail-open"}
    assert body["upstreams"] == [{"name": "fake", "usable": True, "circuit": "closed", "why": None}]
    assert get(gw.url, "/readyz").headers["x-detgate-cache"] == "bypass"


def test_a_redis_it_cannot_use_is_degraded_when_failing_open(gateway, tmp_path):
    # The case: a Redis is there, but not for this gateway (it asks for a password).
    port = free_port()
    locked = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--dir", str(tmp_path), "--requirepass", "not-the-gateways"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not listen"
                time.sleep(0.02)
        gw = gateway(redis_url=f"redis://127.0.0.1:{port}/0")
        status, body = ready(gw)
        assert status == 200 and body["ready"] and body["degraded"]
        assert not body["store"]["healthy"] and body["store"]["error"].startswith("redis")
        assert str(port) not in body["store"]["error"]   # the driver's words with the address stay in the log
        assert get(gw.url, "/healthz").status == 200
        assert value(samples(gw.url), "detgate_store_up") == 0
        assert value(samples(gw.url), "detgate_ready") == 1
    finally:
        locked.kill()
        locked.wait()


def test_fail_closed_is_unready_while_redis_is_down(gateway, own_redis):
    gw = gateway(redis_url=own_redis.url, cache_failure="fail-closed")
    assert ready(gw)[0] == 200
    own_redis.kill9()
    status, body = ready(gw)
    assert status == 503 and not body["ready"] and body["store"]["policy"] == "fail-closed"
    assert get(gw.url, "/healthz").status == 200
    own_redis.restart()
    assert ready(gw)[0] == 200


def test_an_upstream_without_its_key_is_not_usable(gateway, upstream, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    gw = gateway(upstreams=[f"openai={upstream[1]}#openai"])
    status, body = ready(gw)
    assert status == 503 and body["upstreams"][0]["why"] == "no key: $OPENAI_API_KEY is not set"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert ready(gw)[0] == 200


def test_an_open_circuit_makes_the_only_upstream_unusable(gateway, upstream):
    fake, _ = upstream
    gw = gateway(breaker_failures=1, breaker_open_s=30, upstream_max_attempts=1)
    fake.behaviour.fail_status = 500
    assert post(gw.url, "/v1/chat/completions", CHAT).status >= 500
    status, body = ready(gw)
    assert status == 503 and body["upstreams"][0]["circuit"] == "open"
    assert value(samples(gw.url), "detgate_upstream_usable", upstream="fake") == 0
