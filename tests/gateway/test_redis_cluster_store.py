"""The gateway on a real 3-master Redis Cluster (`--redis-url redis+cluster://host:port`):
the store keeps its promises there, and two gateway processes still make one upstream
call for concurrent identical requests, with entries spread over every master."""
from __future__ import annotations

import asyncio

import pytest
import redis

import test_gateway_stores as contract
from gateway.cache.redis_store import RedisStore, entry_name
from gw_http import CHAT, post, post_all, serve_args


@pytest.fixture
def cluster_url(cluster):
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    client.close()
    return f"redis+cluster://127.0.0.1:{cluster.ports[1]}"


@pytest.mark.parametrize("promise", [contract.test_first_writer_wins_and_commit_releases_the_lock,
                                     contract.test_commit_leaves_another_owners_lock_alone,
                                     contract.test_lock_is_exclusive_owned_and_leased,
                                     contract.test_an_entry_with_a_ttl_ages_out])
async def test_the_cluster_store_keeps_the_store_contract(cluster_url, promise):
    store = RedisStore(cluster_url)
    try:
        await promise(store)
    finally:
        await store.close()


async def test_two_gateways_on_a_cluster_make_one_upstream_call(upstream, cluster, cluster_url, gateway_process):
    fake, url = upstream
    args = serve_args(url, cluster_url, "--near-cache-ttl-s", "0")
    a, b = gateway_process(args), gateway_process(args)
    fake.behaviour.delay_s = 1.0
    results = await post_all([a.url, b.url] * 5, CHAT)
    assert fake.started == 1
    assert sorted(c for c, _ in results) == ["coalesced"] * 9 + ["miss"]
    assert len({body for _, body in results}) == 1
    fake.behaviour.delay_s = 0
    # Many keys: spread over all three masters, each answered once and identically after.
    bodies = [{**CHAT, "seed": 100 + i} for i in range(30)]
    first = await asyncio.gather(*(asyncio.to_thread(post, (a, b)[i % 2].url, "/v1/chat/completions", body)
                                   for i, body in enumerate(bodies)))
    again = [post((b, a)[i % 2].url, "/v1/chat/completions", body) for i, body in enumerate(bodies)]
    assert [r.cache for r in again] == ["hit"] * 30
    assert [r.body for r in again] == [r.body for r in first]
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    owners = {client.get_node_from_key(entry_name(r.key)).port for r in first}
    client.close()
    assert owners == set(cluster.ports)
    assert fake.started == 31
