"""Real `detgate serve` processes on one real Redis: shared entries, cross-replica
single-flight, takeover from a dead holder, and entries that survive a restart."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import aiohttp
import orjson
import redis

from gw_http import CHAT, REPO, post, post_all, serve_args


async def test_two_replicas_make_one_upstream_call(upstream, redis_url, gateway_process):
    fake, url = upstream
    fake.behaviour.delay_s = 1.5
    a, b = gateway_process(serve_args(url, redis_url)), gateway_process(serve_args(url, redis_url))
    results = await post_all([a.url, b.url] * 5, CHAT)
    assert fake.started == 1
    assert sorted(c for c, _ in results) == ["coalesced"] * 9 + ["miss"]
    assert len({body for _, body in results}) == 1


async def test_a_dead_holder_is_taken_over_after_its_lease(upstream, redis_url, gateway_process):
    fake, url = upstream
    args = serve_args(url, redis_url, "--lock-lease-ms", "600")
    a, b = gateway_process(args), gateway_process(args)
    fake.behaviour.delay_s = 30  # A's call hangs...
    async with aiohttp.ClientSession() as session:
        doomed = asyncio.ensure_future(session.post(a.url + "/v1/chat/completions", data=orjson.dumps(CHAT)))
        while fake.started == 0:
            await asyncio.sleep(0.01)
        fake.behaviour.delay_s = 0
        waiter = asyncio.ensure_future(post_all([b.url], CHAT))
        await asyncio.sleep(0.2)
        assert not waiter.done()  # B waits on A's lock rather than calling upstream itself
        a.kill()  # ...and A dies holding the lock
        started = time.monotonic()
        [(cache, body)] = await asyncio.wait_for(waiter, 10)
        assert time.monotonic() - started < 3
        try:
            await doomed
        except aiohttp.ClientError:
            pass
    assert cache == "miss"  # B filled it itself once the lease ran out
    assert fake.started == 2
    assert post(b.url, "/v1/chat/completions", CHAT).body == body


def test_entries_survive_a_restart_with_identical_bytes(upstream, redis_url, gateway_process):
    fake, url = upstream
    first = gateway_process(serve_args(url, redis_url))
    stored = post(first.url, "/v1/chat/completions", CHAT)
    streamed = post(first.url, "/v1/chat/completions", {**CHAT, "stream": True})
    first.stop()
    second = gateway_process(serve_args(url, redis_url))
    again = post(second.url, "/v1/chat/completions", CHAT)
    again_stream = post(second.url, "/v1/chat/completions", {**CHAT, "stream": True})
    assert (again.cache, again.body, again.key) == ("hit", stored.body, stored.key)
    assert (again_stream.cache, again_stream.body) == ("hit", streamed.body)
    assert len(fake.calls) == 1


def test_a_tampered_entry_is_refilled_not_served(upstream, redis_url, gateway):
    fake, _ = upstream
    gw = gateway(redis_url=redis_url, near_cache_ttl_s=0)  # read Redis every time
    stored = post(gw.url, "/v1/chat/completions", CHAT)
    client = redis.Redis.from_url(redis_url)
    [name] = client.keys("detgate:e:*")
    client.set(name, client.get(name).replace(b"fake-0001", b"fake-0002"))
    refilled = post(gw.url, "/v1/chat/completions", CHAT)
    assert refilled.cache == "miss" and refilled.body != stored.body
    assert post(gw.url, "/v1/chat/completions", CHAT).body == refilled.body
    client.close()


def test_redis_without_a_secret_refuses_to_start(upstream, redis_url):
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--port", "0", "--redis-url", redis_url],
                          cwd=REPO, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "--redis-url needs --secret" in done.stderr and "Traceback" not in done.stderr
