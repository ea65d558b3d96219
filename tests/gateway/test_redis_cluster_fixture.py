"""A real 3-master Redis Cluster on loopback, and the commands the gateway needs from it.

Single-flight and first-writer-wins (gateway/cache/redis_store.py) need, per request key K:
SET NX PX (take the lease), GET, SET NX (write the entry once), SET (refresh), and two
one-key Lua scripts that renew or release the lease only while it is still one's own.
Every one of them touches a single key, so each runs on a cluster as is; a hash tag {K}
is needed only if lock and entry are ever used together in one command or script.
"""
import asyncio
import subprocess

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from gateway.ingress.ratelimit import Limit, LocalRateLimiter, RedisRateLimiter

RELEASE_IF_MINE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
RENEW_IF_MINE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


@pytest.fixture
async def rc(cluster):
    client = aioredis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    await client.initialize()
    await client.flushall(target_nodes=aioredis.RedisCluster.PRIMARIES)
    yield client
    await client.aclose()


def test_three_masters_cover_every_slot(cluster):
    nodes = subprocess.run(["redis-cli", "-p", str(cluster.ports[0]), "cluster", "nodes"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    masters = [line for line in nodes if "master" in line.split()[2]]
    assert len(masters) == 3 and all("connected" in m for m in masters)


async def test_keys_spread_over_all_masters_but_a_hash_tag_pins_them_together(rc):
    owners = {rc.get_node_from_key(f"detgate:entry:{i}").port for i in range(100)}
    assert len(owners) == 3
    key = "abc123"
    assert rc.keyslot(f"detgate:lock:{{{key}}}") == rc.keyslot(f"detgate:entry:{{{key}}}")


async def test_lease_lock_with_set_nx_px_and_takeover_after_expiry(rc):
    lock = "detgate:lock:{k1}"
    assert await rc.set(lock, "holder-a", nx=True, px=150) is True
    assert await rc.set(lock, "holder-b", nx=True, px=150) is None
    assert 0 < await rc.pttl(lock) <= 150
    assert await rc.pexpire(lock, 300)  # the holder extends its lease while working
    assert 150 < await rc.pttl(lock) <= 300
    await asyncio.sleep(0.35)  # holder died: lease runs out
    assert await rc.set(lock, "holder-b", nx=True, px=150) is True
    assert await rc.get(lock) == b"holder-b"


async def test_first_writer_wins_on_the_entry(rc):
    entry = "detgate:entry:{k2}"
    results = await asyncio.gather(*[rc.set(entry, f"answer-{i}".encode(), nx=True) for i in range(20)])
    assert sum(r is True for r in results) == 1
    winner = results.index(True)
    assert await rc.get(entry) == f"answer-{winner}".encode()


async def test_renew_and_release_only_ones_own_lease_with_one_key_scripts(rc):
    renew = rc.register_script(RENEW_IF_MINE)
    release = rc.register_script(RELEASE_IF_MINE)
    await rc.set("detgate:lock:{k3}", "me", px=1000)
    assert await renew(keys=["detgate:lock:{k3}"], args=["someone-else", 9000]) == 0
    assert await rc.pttl("detgate:lock:{k3}") <= 1000
    assert await renew(keys=["detgate:lock:{k3}"], args=["me", 9000]) == 1
    assert await rc.pttl("detgate:lock:{k3}") > 1000
    assert await release(keys=["detgate:lock:{k3}"], args=["someone-else"]) == 0
    assert await release(keys=["detgate:lock:{k3}"], args=["me"]) == 1
    assert await rc.exists("detgate:lock:{k3}") == 0


async def test_lock_and_entry_together_need_the_hash_tag(rc):
    both = rc.register_script("return redis.call('EXISTS', KEYS[1], KEYS[2])")
    assert await both(keys=["detgate:lock:{k4}", "detgate:entry:{k4}"]) == 0
    untagged = [f"detgate:lock:{i}" for i in range(50)]
    a, b = next((x, y) for x in untagged for y in untagged if rc.keyslot(x) != rc.keyslot(y))
    with pytest.raises((redis.exceptions.RedisClusterException, redis.exceptions.ResponseError)):
        await both(keys=[a, b])


async def test_pubsub_reaches_subscribers_on_other_nodes(rc, cluster):
    # Waiters may subscribe for "entry written" instead of polling; classic pub/sub is
    # broadcast over the cluster bus, so publisher and subscriber can sit on different nodes.
    sub = aioredis.Redis(port=cluster.ports[1])
    pub = aioredis.Redis(port=cluster.ports[2])
    try:
        ps = sub.pubsub()
        await ps.subscribe("detgate:done:{k5}")
        await ps.get_message(timeout=1)  # the subscribe confirmation
        assert await pub.publish("detgate:done:{k5}", b"written") >= 0
        msg = await ps.get_message(ignore_subscribe_messages=True, timeout=2)
        assert msg is not None and msg["data"] == b"written"
        await ps.aclose()
    finally:
        await sub.aclose()
        await pub.aclose()


async def test_rate_limiter_runs_unchanged_on_the_cluster(rc):
    rl = RedisRateLimiter(rc, LocalRateLimiter({}, default=Limit(rate=1, burst=2)))
    for tenant in ("alice", "bob", "carol"):
        assert [(await rl.check(tenant)).allowed for _ in range(3)] == [True, True, False]


async def test_a_killed_node_restarts_and_the_client_finds_it(cluster):
    client = aioredis.RedisCluster(host="127.0.0.1", port=cluster.ports[1])
    try:
        await client.initialize()
        key = next(k for k in (f"k{i}" for i in range(1000))
                   if client.get_node_from_key(k).port == cluster.ports[0])
        cluster.nodes[0].kill9()
        with pytest.raises(redis.exceptions.RedisError):
            await client.set(key, "v")
        cluster.restart_node(0)
        for _ in range(50):  # the client rediscovers the node on its own
            try:
                assert await client.set(key, "v") is True
                break
            except redis.exceptions.RedisError:
                await asyncio.sleep(0.1)
        assert await client.get(key) == b"v"
    finally:
        await client.aclose()
