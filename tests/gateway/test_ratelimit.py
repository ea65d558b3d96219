"""Per-tenant token buckets, in-process and shared through a real redis-server."""
import asyncio
import copy
import time

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ingress.ratelimit import Limit, LocalRateLimiter, RedisRateLimiter, TokenBucket, retry_after_header
from redis_process import RedisProcess


class Clock:
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def test_bucket_allows_a_burst_then_says_how_long_to_wait():
    b = TokenBucket(Limit(rate=2, burst=3), now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.5)
    assert b.take(0.25) == pytest.approx(0.25)  # half a token back already
    assert b.take(0.5) == 0.0
    assert b.take(100.0) == 0.0 and b.take(100.0) == 0.0 and b.take(100.0) == 0.0  # refilled to burst, not beyond
    assert b.take(100.0) > 0


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.1, 100), burst=st.integers(1, 50),
       gaps=st.lists(st.floats(0, 2), min_size=1, max_size=300))
def test_a_bucket_never_admits_more_than_burst_plus_rate_times_elapsed(rate, burst, gaps):
    b = TokenBucket(Limit(rate, burst), now=0.0)
    now, admitted = 0.0, 0
    for gap in gaps:
        now += gap
        wait = b.take(now)
        admitted += wait == 0.0
        assert admitted <= burst + rate * now + 1e-9
        if wait:  # the promised wait is honest: after it, the request is admitted
            assert copy.copy(b).take(now + wait + 1e-9) == 0.0


def test_tenants_have_their_own_buckets_and_limits():
    clock = Clock()
    rl = LocalRateLimiter({"small": Limit(1, 1), "big": Limit(1, 5)}, default=None, clock=clock)
    assert rl.check("small").allowed
    denied = rl.check("small")
    assert not denied.allowed and denied.retry_after == pytest.approx(1.0) and denied.source == "local"
    assert all(rl.check("big").allowed for _ in range(5))
    assert rl.check("nobody").source == "none"  # no default: unlimited
    clock.now += 1
    assert rl.check("small").allowed


def test_idle_full_buckets_are_dropped():
    clock = Clock()
    rl = LocalRateLimiter({}, default=Limit(rate=10, burst=10), clock=clock, prune_every=1)
    for i in range(100):
        rl.check(f"tenant-{i}")
    assert 90 <= len(rl) <= 100
    clock.now += 0.05  # half a token back: nobody is full yet
    rl.check("x")
    assert len(rl) >= 100
    clock.now += 1.0
    rl.check("x")
    assert len(rl) == 1  # only the one just used


@pytest.mark.parametrize("seconds, header", [(0.01, "1"), (1.0, "1"), (1.2, "2"), (0, "1")])
def test_retry_after_header_is_whole_seconds_rounded_up(seconds, header):
    assert retry_after_header(seconds) == header


@pytest.fixture(scope="module")
def redis_proc(tmp_path_factory):
    with RedisProcess(tmp_path_factory.mktemp("ratelimit-redis")) as proc:
        yield proc


@pytest.fixture
async def client(redis_proc):
    if not redis_proc.running:
        redis_proc.start()
    c = aioredis.Redis(port=redis_proc.port, socket_connect_timeout=0.2, socket_timeout=0.2)
    await c.flushall()
    yield c
    await c.aclose()


async def test_redis_bucket_matches_the_local_one(client):
    rl = RedisRateLimiter(client, LocalRateLimiter({"t": Limit(rate=1, burst=3)}))
    decisions = [await rl.check("t") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert {d.source for d in decisions} == {"redis"}
    assert 0.9 < decisions[-1].retry_after <= 1.0
    # The key lives only until the bucket would be full again.
    assert 0 < await client.pttl(rl.key("t")) <= 3001


async def test_replicas_share_one_bucket(client, redis_proc):
    other = aioredis.Redis(port=redis_proc.port)
    try:
        limits = {"t": Limit(rate=0.5, burst=4)}
        a = RedisRateLimiter(client, LocalRateLimiter(limits))
        b = RedisRateLimiter(other, LocalRateLimiter(limits))
        results = await asyncio.gather(*[(a if i % 2 else b).check("t") for i in range(10)])
        assert sum(d.allowed for d in results) == 4  # not 4 per replica
    finally:
        await other.aclose()


async def test_redis_bucket_refills_with_time(client):
    rl = RedisRateLimiter(client, LocalRateLimiter({"t": Limit(rate=20, burst=1)}))
    assert (await rl.check("t")).allowed
    denied = await rl.check("t")
    assert not denied.allowed
    await asyncio.sleep(denied.retry_after + 0.01)
    assert (await rl.check("t")).allowed


async def test_fails_open_to_the_local_bucket_when_redis_dies_and_recovers(client, redis_proc):
    errors = []
    rl = RedisRateLimiter(client, LocalRateLimiter({"t": Limit(rate=1, burst=2)}), timeout=0.3,
                          on_redis_error=errors.append)
    assert (await rl.check("t")).source == "redis"
    redis_proc.kill9()
    start = time.monotonic()
    down = [await rl.check("t") for _ in range(3)]
    assert time.monotonic() - start < 3 * 0.3 + 0.5  # a dead Redis never holds a request long
    assert [d.source for d in down] == ["fallback"] * 3
    assert [d.allowed for d in down] == [True, True, False]  # the local bucket still limits
    assert len(errors) == 3
    redis_proc.restart()
    assert (await rl.check("t")).source == "redis"  # reconnected by itself


async def test_unlimited_tenants_never_touch_redis(client):
    rl = RedisRateLimiter(client, LocalRateLimiter({}))
    assert (await rl.check("anyone")).source == "none"
    assert await client.dbsize() == 0
