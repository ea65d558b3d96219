"""Both stores keep the same promises: first writer wins, leases lapse, owners are checked."""
from __future__ import annotations

import asyncio

import pytest

from gateway.cache.memory_store import MemoryStore
from gateway.cache.redis_store import RedisStore


@pytest.fixture(params=["memory", "redis"])
async def store(request):
    if request.param == "memory":
        s = MemoryStore(1 << 20)
    else:
        s = RedisStore(request.getfixturevalue("redis_url"))
    yield s
    await s.close()


async def test_first_writer_wins_and_commit_releases_the_lock(store):
    assert await store.get("k") is None
    assert await store.try_lock("k", "a", 10_000)
    assert await store.commit("k", b"first", "a") is True
    assert await store.try_lock("k", "b", 10_000)  # a's lock went with its commit
    assert await store.commit("k", b"second", "b") is False
    assert await store.get("k") == b"first"
    assert await store.commit("k", b"refreshed", "c", overwrite=True) is True
    assert await store.get("k") == b"refreshed"


async def test_commit_leaves_another_owners_lock_alone(store):
    assert await store.try_lock("k", "a", 10_000)
    assert await store.commit("k", b"v", "b") is True
    assert not await store.try_lock("k", "b", 10_000)


async def test_lock_is_exclusive_owned_and_leased(store):
    assert await store.try_lock("k", "a", 200)
    assert not await store.try_lock("k", "b", 200)
    assert not await store.renew("k", "b", 200)
    await store.unlock("k", "b")  # not b's to release
    assert not await store.try_lock("k", "b", 200)
    assert await store.renew("k", "a", 200)
    await asyncio.sleep(0.3)  # the lease lapses without renewal
    assert await store.try_lock("k", "b", 200)
    await store.unlock("k", "b")
    assert await store.try_lock("k", "a", 200)


async def test_memory_store_evicts_least_recently_used_within_its_budget():
    store = MemoryStore(100)
    await store.commit("a", b"x" * 39, "o")  # 40 bytes with its key
    await store.commit("b", b"x" * 39, "o")
    await store.get("a")  # a is now more recent than b
    await store.commit("c", b"x" * 39, "o")
    assert (await store.get("a"), await store.get("b")) == (b"x" * 39, None)
    assert store.nbytes == 80 and len(store) == 2
    assert await store.commit("huge", b"x" * 200, "o") is False  # never fits: stored nowhere, evicts nothing
    assert store.nbytes == 80


async def test_near_cache_reuses_reads_for_its_ttl_and_sees_its_own_refreshes(redis_url):
    import redis.asyncio as aioredis

    from gateway.cache.near_cache import NearCache
    from gateway.cache.redis_store import entry_name
    now = [0.0]
    near = NearCache(RedisStore(redis_url), ttl_s=1.0, max_bytes=1 << 20, clock=lambda: now[0])
    other = aioredis.Redis.from_url(redis_url)
    assert await near.commit("k", b"v1", "o")
    await other.set(entry_name("k"), b"v2")  # a refresh made by another replica
    assert await near.get("k") == b"v1"  # not seen yet...
    now[0] = 1.5
    assert await near.get("k") == b"v2"  # ...but within the TTL
    await near.commit("k", b"v3", "o", overwrite=True)  # a refresh made here is seen at once
    assert await near.get("k") == b"v3"
    await other.aclose()
    await near.close()


async def test_an_entry_with_a_ttl_ages_out(store):
    assert await store.commit("k", b"short", "a", ttl_ms=300) is True
    assert await store.commit("forever", b"long", "a") is True
    value, left = await store.get_expiring("k")
    assert value == b"short" and 0 < left <= 0.3
    assert await store.get_expiring("forever") == (b"long", None)
    await asyncio.sleep(0.4)
    assert await store.get("k") is None and await store.get_expiring("k") == (None, None)
    assert [key async for key in store.keys()] == ["forever"]
    assert await store.commit("k", b"again", "b") is True  # first writer wins again once it aged out
    assert await store.commit("forever", b"refreshed", "c", overwrite=True, ttl_ms=300) is True
    await asyncio.sleep(0.4)
    assert await store.get("forever") is None  # a refresh sets the TTL it is given


async def test_a_near_cache_copy_never_outlives_its_entry(redis_url):
    import redis.asyncio as aioredis

    from gateway.cache.near_cache import NearCache
    from gateway.cache.redis_store import entry_name
    near = NearCache(RedisStore(redis_url), ttl_s=30.0, max_bytes=1 << 20)
    other = aioredis.Redis.from_url(redis_url)
    assert await near.commit("mine", b"v", "o", ttl_ms=300)  # written here
    await other.set(entry_name("theirs"), b"w", px=300)  # written by another replica, then read here
    assert await near.get("theirs") == b"w" and await near.get("mine") == b"v"
    await asyncio.sleep(0.4)
    assert await near.get("theirs") is None and await near.get("mine") is None
    await other.aclose()
    await near.close()
