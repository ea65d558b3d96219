"""The operator's cache API and `detgate cache ls|show|rm`: entries listed by what filled them,
cursor-paged over SCAN, shown whole, deleted one by one or by filter, with counts in the answer
and in the metrics; deletes that never remove an entry refilled since, while requests fill the
same keys. On the in-process store, a real redis-server and a real Redis Cluster."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request

import aiohttp
import orjson
import pytest
import redis

from gateway.cache.admin import CacheAdmin, Filters
from gateway.cache.entry import Entry, Sealer
from gateway.cache.memory_store import MemoryStore
from gateway.cache.redis_store import RedisStore
from gw_http import REPO, SECRET, _send, assert_openai_error, client, get, value

TOKEN = "op-token-cache-9d2e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TENANTS = {"acme": "gw-key-acme", "globex": "gw-key-globex"}


def delete(base: str, path: str, headers=AUTH):
    return _send(urllib.request.Request(base + path, method="DELETE", headers=headers))


def ask(base: str, tenant: str, model: str, text: str) -> None:
    c = client(base)
    c.api_key = TENANTS[tenant]
    c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])


def fill(base: str) -> None:
    for i in range(3):
        ask(base, "acme", "fake/m1", f"question {i}")
    for i in range(2):
        ask(base, "globex", "fake/m2", f"question {i}")


@pytest.fixture
def gw(gateway):
    return gateway(tenants=TENANTS, operator_token=TOKEN)


def test_list_filters_and_show_what_filled_an_entry(gw):
    fill(gw.url)
    page = get(gw.url, "/detgate/cache", AUTH).json()
    assert page["matched"] == 5 and page["cursor"] is None and len(page["entries"]) == 5
    acme = get(gw.url, "/detgate/cache?tenant=acme", AUTH).json()["entries"]
    assert {e["tenant"] for e in acme} == {"acme"} and len(acme) == 3
    assert {e["model"] for e in acme} == {"m1"} and {e["upstream"] for e in acme} == {"fake"}
    assert len(get(gw.url, "/detgate/cache?model=m*&surface=chat.completions&finish=stop", AUTH).json()["entries"]) == 5
    assert get(gw.url, "/detgate/cache?older_than_s=3600", AUTH).json()["entries"] == []
    assert len(get(gw.url, "/detgate/cache?newer_than_s=3600&model=m2", AUTH).json()["entries"]) == 2

    shown = get(gw.url, f"/detgate/cache/{acme[0]['key']}", AUTH).json()
    origin = shown["origin"]
    assert origin["tenant"] == "acme" and origin["filled_by"]["tenant"] == "acme" and origin["filled_at_ms"] > 0
    assert origin["key_fields"]["route"] == "chat.completions" and origin["key_fields"]["strategy"] == "single"
    assert origin["request"]["preview"].startswith("question ") and origin["request"]["texts"] == 1
    assert shown["record"]["body"]["choices"][0]["message"]["content"] and shown["record"]["finish"] == "stop"
    assert shown["fingerprint"] == shown["record"]["body"]["system_fingerprint"] and len(shown["seal"]) == 64
    by_build = get(gw.url, f"/detgate/cache?fingerprint={shown['fingerprint']}", AUTH).json()["entries"]
    assert len(by_build) == 5   # the fake provider's one build
    assert get(gw.url, "/detgate/cache?fingerprint=fp_other", AUTH).json()["entries"] == []


def test_delete_one_then_by_filter_with_counts_in_answer_and_metrics(gw, upstream):
    fake, _ = upstream
    fill(gw.url)
    key = get(gw.url, "/detgate/cache?tenant=globex", AUTH).json()["entries"][0]["key"]
    assert delete(gw.url, f"/detgate/cache/{key}").json() == {"key": key, "deleted": 1, "changed": 0}
    assert_openai_error(get(gw.url, f"/detgate/cache/{key}", AUTH), 404, code="entry_not_found")
    assert_openai_error(delete(gw.url, f"/detgate/cache/{key}"), 404, code="entry_not_found")
    gone = delete(gw.url, "/detgate/cache?tenant=acme&model=m1").json()
    assert gone["deleted"] == 3 and gone["matched"] == 3 and gone["changed"] == 0
    assert [e["tenant"] for e in get(gw.url, "/detgate/cache", AUTH).json()["entries"]] == ["globex"]
    calls = len(fake.calls)
    ask(gw.url, "acme", "fake/m1", "question 0")   # deleted: asked upstream again
    assert len(fake.calls) == calls + 1
    scraped = _metrics(gw.url)
    assert value(scraped, "detgate_cache_admin_deleted_total", by="key") == 1
    assert value(scraped, "detgate_cache_admin_deleted_total", by="filter") == 3
    assert value(scraped, "detgate_cache_admin_total", op="list") >= 2


def _metrics(url):
    from prometheus_client.parser import text_string_to_metric_families
    reply = get(url, "/metrics", AUTH)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(reply.body.decode()) for s in f.samples}


def test_bad_requests_are_clear_4xx(gw, gateway):
    assert_openai_error(get(gw.url, "/detgate/cache"), 401, code="invalid_operator_token")
    assert_openai_error(get(gw.url, "/detgate/cache", {"Authorization": f"Bearer {TENANTS['acme']}"}), 401)
    assert_openai_error(get(gw.url, "/detgate/cache?colour=red", AUTH), 400, code="invalid_filter")
    assert_openai_error(get(gw.url, "/detgate/cache?older_than_s=soon", AUTH), 400, code="invalid_filter")
    assert_openai_error(get(gw.url, "/detgate/cache?limit=0", AUTH), 400, param="limit")
    assert_openai_error(delete(gw.url, "/detgate/cache"), 400, code="filter_required")
    open_gw = gateway(tenants=TENANTS)   # no operator token: no cache API at all
    assert_openai_error(get(open_gw.url, "/detgate/cache"), 403, code="operator_token_required")


async def _walk(admin: CacheAdmin, filters: Filters, limit: int) -> list[str]:
    keys, cursor = [], ""
    while True:
        page = await admin.page(filters, cursor, limit)
        keys += [e["key"] for e in page["entries"]]
        if page["cursor"] is None:
            return keys
        cursor = page["cursor"]


def _entry(i: int, tenant: str) -> Entry:
    return Entry(orjson.dumps({"n": i}), None, "m", "stop",
                 origin={"tenant": tenant, "upstream": "u", "surface": "chat.completions", "model": "m",
                         "filled_at_ms": 1})


async def _paging_and_conditional_delete(store) -> None:
    sealer = Sealer(SECRET.encode())
    admin = CacheAdmin(store, sealer)
    for i in range(250):
        await store.commit(f"dg2:{i:04d}", sealer.seal(f"dg2:{i:04d}", _entry(i, "a" if i % 2 else "b")), "o")
    walked = await _walk(admin, Filters(), 100)
    assert sorted(walked) == sorted(f"dg2:{i:04d}" for i in range(250))   # every key once
    assert len(await _walk(admin, Filters(tenant="a"), 7)) == 125
    # Chosen by one value, refilled with another before the delete: left alone.
    stale = (await store.get("dg2:0001"))[:Sealer.MAC_LEN]
    await store.commit("dg2:0001", sealer.seal("dg2:0001", _entry(-1, "a")), "o", overwrite=True)
    assert not await store.delete_if("dg2:0001", stale)
    counts = await admin.delete_matching(Filters(tenant="b"))
    assert (counts.matched, counts.deleted, counts.changed) == (125, 125, 0)
    assert sorted(await _walk(admin, Filters(), 50)) == sorted(f"dg2:{i:04d}" for i in range(1, 250, 2))


async def test_paging_and_conditional_delete_in_process():
    await _paging_and_conditional_delete(MemoryStore(2**24))


async def test_paging_and_conditional_delete_on_redis(redis_url):
    store = RedisStore(redis_url, timeout_s=5.0)   # a loaded CI machine once took over 1 s to connect on loopback
    try:
        await _paging_and_conditional_delete(store)
    finally:
        await store.close()


async def test_paging_and_conditional_delete_on_a_cluster(cluster):
    c = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    c.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    c.close()
    store = RedisStore(f"redis+cluster://127.0.0.1:{cluster.ports[1]}")
    try:
        await _paging_and_conditional_delete(store)
    finally:
        await store.close()


async def test_deleting_while_requests_fill_the_same_keys(gateway, redis_url):
    gw = gateway(tenants=TENANTS, operator_token=TOKEN, redis_url=redis_url, near_cache_ttl_s=0)
    bodies = [{"model": "fake/m1", "messages": [{"role": "user", "content": f"q{i % 4}"}]} for i in range(60)]
    auth = {"Authorization": f"Bearer {TENANTS['acme']}", "Content-Type": "application/json"}

    async with aiohttp.ClientSession() as session:
        async def request(body):
            async with session.post(gw.url + "/v1/chat/completions", data=orjson.dumps(body), headers=auth) as r:
                assert r.status == 200, await r.text()
                return orjson.loads(await r.read())

        async def deleter():
            deleted = 0
            for _ in range(15):
                async with session.delete(gw.url + "/detgate/cache?tenant=acme", headers=AUTH) as r:
                    assert r.status == 200
                    deleted += (await r.json())["deleted"]
                await asyncio.sleep(0.01)
            return deleted

        answers, deleted = await asyncio.gather(asyncio.gather(*(request(b) for b in bodies)), deleter())
    assert all(a["choices"][0]["message"]["content"] for a in answers)
    assert deleted > 0
    page = get(gw.url, "/detgate/cache", AUTH).json()
    assert page["unreadable"] == 0 and page["matched"] <= 4   # every entry left is whole
    assert_openai_error(get(gw.url, "/detgate/cache?cursor=zzz", AUTH), 400, param="cursor")


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-m", "gateway", "cache", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_cli_through_a_gateway_and_on_redis(gateway, redis_url):
    gw = gateway(tenants=TENANTS, operator_token=TOKEN, redis_url=redis_url)
    fill(gw.url)
    through = ["--gateway", gw.url, "--operator-token", TOKEN]
    listed = _cli("ls", *through, "--tenant", "globex")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["KEY", "TENANT", "UPSTREAM"] and len(lines) == 1 + 2 + 1
    key = lines[1].split()[0]
    shown = _cli("show", key, "--redis-url", redis_url, "--secret", SECRET)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["origin"]["tenant"] == "globex"
    as_json = _cli("ls", "--redis-url", redis_url, "--secret", SECRET, "--json", "--model", "m1")
    assert len(orjson.loads(as_json.stdout)["entries"]) == 3
    removed = _cli("rm", "--all-matching", "--tenant", "acme", *through)
    assert removed.returncode == 0 and "deleted 3" in removed.stdout
    assert _cli("rm", key, "--redis-url", redis_url, "--secret", SECRET).stdout.startswith("deleted 1")
    refused = _cli("rm", "--all-matching", *through)
    assert refused.returncode == 2 and "filter" in refused.stderr
    missing = _cli("show", "dg2:nothing", *through)
    assert missing.returncode == 1 and "No cache entry" in missing.stderr
