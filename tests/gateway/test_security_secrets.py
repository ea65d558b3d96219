"""The upstream API key never leaves the gateway except towards its upstream: not in logs,
not in cache entries, not in error bodies or headers, not in /metrics. A canary key is
sent through every path (answers, streams, upstream errors that quote it, timeouts,
broken streams), then searched for everywhere the gateway writes."""
from __future__ import annotations

import redis

from gw_http import CHAT, SECRET, get, post

CANARY = "sk-canary-5f0c1e7a9d2b4c6e8f01"


def test_the_upstream_key_appears_nowhere_but_upstream(upstream, redis_url, gateway_process, tmp_path):
    fake, url = upstream
    config = tmp_path / "detgate.toml"
    # The echo route, allow-listed, shows what the upstream received: the operator meant it to.
    config.write_text(f'[[upstreams]]\nname = "fake"\nurl = "{url}"\napi_key_env = "FAKE_KEY"\n'
                      'proxy = ["POST /echo/{what}"]\n')
    gw = gateway_process(["--config", str(config), "--redis-url", redis_url, "--secret", SECRET, "--log-level", "DEBUG",
                          "--upstream-max-attempts", "2", "--upstream-idle-timeout-s", "0.5", "--breaker-failures", "0"], env={"FAKE_KEY": CANARY})
    replies = [post(gw.url, "/v1/chat/completions", CHAT), post(gw.url, "/v1/chat/completions", CHAT),
               post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True, "seed": 1}),
               post(gw.url, "/v1/completions", {"model": "fake/m1", "prompt": "p"}),
               post(gw.url, "/v1/embeddings", {"model": "fake/m1", "input": "e"})]
    fake.behaviour.error_echoes_key = True
    for status in (401, 429, 500):
        fake.behaviour.fail_status = status
        replies.append(post(gw.url, "/v1/chat/completions", {**CHAT, "seed": status}))
        replies.append(post(gw.url, "/v1/chat/completions", {**CHAT, "seed": status, "stream": True}))
    fake.behaviour.fail_status = None
    fake.behaviour.stall_stream_after, fake.behaviour.stall_s = 2, 2.0
    replies.append(post(gw.url, "/v1/chat/completions", {**CHAT, "seed": 7, "stream": True}))
    fake.behaviour.stall_stream_after = None
    replies.append(get(gw.url, "/metrics"))

    assert {r.status for r in replies} >= {200, 401, 429, 500}
    assert any(b"[redacted]" in r.body for r in replies)  # the upstream did quote it
    # ...because it was really sent there (the fake's echo route shows what it received).
    assert post(gw.url, "/v1/echo/x", b"{}").json()["authorization"] == f"Bearer {CANARY}"

    for reply in replies:
        assert CANARY.encode() not in reply.body
        assert CANARY not in str(reply.headers)
    gw.stop()
    logs = gw.process.stderr.read()
    assert b"detgate.access" in logs and CANARY.encode() not in logs
    client = redis.Redis.from_url(redis_url)
    names = client.keys("*")
    assert names and all(CANARY.encode() not in (client.dump(n) or b"") + n for n in names)
    client.close()
