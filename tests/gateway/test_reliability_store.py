"""The store going away: fail-open answers uncached and says so, fail-closed refuses with a
503; the gateway starts without its Redis when fail-open and reconnects by itself; a hung
Redis costs a request no more than the store timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fakes.loopback import free_port
from gw_http import CHAT, REPO, SECRET, post, samples, value
from redis_process import RedisProcess


@pytest.fixture
def redis_proc(tmp_path):
    proc = RedisProcess(tmp_path / "redis").start()
    yield proc
    if proc.proc is not None and proc.running:
        os.kill(proc.proc.pid, signal.SIGCONT)  # in case a test left it stopped
    proc.stop()


def test_fail_open_answers_from_the_upstream_labelled_bypass_and_counted(upstream, gateway, redis_proc):
    fake, _ = upstream
    gw = gateway(redis_url=redis_proc.url, near_cache_ttl_s=0)
    assert post(gw.url, "/v1/chat/completions", CHAT).cache == "miss"
    redis_proc.kill9()
    down = [post(gw.url, "/v1/chat/completions", {**CHAT, "stream": stream}) for stream in (False, True, False)]
    assert [(r.status, r.cache) for r in down] == [(200, "bypass")] * 3
    assert len(fake.calls) == 4  # every outage answer came from the upstream
    assert value(samples(gw.url), "detgate_cache_bypass_total", reason="store_down") == 3
    redis_proc.restart()  # empty again: nothing persisted
    back = [post(gw.url, "/v1/chat/completions", CHAT) for _ in range(2)]
    assert [r.cache for r in back] == ["miss", "hit"]  # reconnected by itself


def test_fail_closed_refuses_with_a_503_while_the_store_is_down(upstream, gateway, redis_proc):
    fake, _ = upstream
    gw = gateway(redis_url=redis_proc.url, near_cache_ttl_s=0, cache_failure="fail-closed")
    assert post(gw.url, "/v1/chat/completions", CHAT).status == 200
    redis_proc.kill9()
    refused = post(gw.url, "/v1/chat/completions", {**CHAT, "seed": 1})
    assert refused.status == 503 and refused.json()["error"]["code"] == "cache_unavailable"
    assert refused.headers["retry-after"] == "1"
    assert len(fake.calls) == 1  # refused before any upstream call
    redis_proc.restart()
    assert post(gw.url, "/v1/chat/completions", {**CHAT, "seed": 1}).cache == "miss"


def test_a_split_request_meets_a_down_store_like_a_single_one(upstream, gateway, redis_proc):
    fake, _ = upstream
    open_gw = gateway(redis_url=redis_proc.url, near_cache_ttl_s=0)
    replay_gw = gateway(redis_url=redis_proc.url, near_cache_ttl_s=0, mode="replay")
    redis_proc.kill9()
    down = post(open_gw.url, "/v1/chat/completions", {**CHAT, "n": 2})
    assert (down.status, down.cache) == (200, "bypass")
    assert value(samples(open_gw.url), "detgate_cache_bypass_total", reason="store_down") == 2  # one per part
    calls = len(fake.calls)
    replayed = post(replay_gw.url, "/v1/chat/completions", {**CHAT, "n": 2})
    assert replayed.status == 503 and replayed.json()["error"]["code"] == "cache_unavailable"
    assert len(fake.calls) == calls  # replay never calls upstream


def test_fail_open_starts_without_its_redis_and_caches_once_it_appears(upstream, gateway, tmp_path):
    port = free_port()
    gw = gateway(redis_url=f"redis://127.0.0.1:{port}/0", near_cache_ttl_s=0)
    assert post(gw.url, "/v1/chat/completions", CHAT).cache == "bypass"
    with RedisProcess(tmp_path / "late", port):
        assert [post(gw.url, "/v1/chat/completions", CHAT).cache for _ in range(2)] == ["miss", "hit"]


def test_fail_closed_refuses_to_start_without_its_redis():
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--port", "0", "--secret", SECRET,
                           "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--cache-failure", "fail-closed"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "cannot reach the store" in done.stderr and "Traceback" not in done.stderr


def test_a_hung_redis_costs_no_more_than_the_store_timeout(upstream, gateway, redis_proc):
    gw = gateway(redis_url=redis_proc.url, near_cache_ttl_s=0, store_timeout_s=0.3)
    assert post(gw.url, "/v1/chat/completions", CHAT).cache == "miss"
    os.kill(redis_proc.proc.pid, signal.SIGSTOP)  # alive, listening, answering nothing
    try:
        started = time.monotonic()
        reply = post(gw.url, "/v1/chat/completions", CHAT)
        elapsed = time.monotonic() - started
    finally:
        os.kill(redis_proc.proc.pid, signal.SIGCONT)
    assert (reply.status, reply.cache) == (200, "bypass")
    # get, lock and commit each wait out the timeout at most twice (one retry on a fresh connection)
    assert elapsed < 6 * 0.3 + 1.0
