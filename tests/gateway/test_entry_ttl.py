"""Entries can age out (issue 22 §3): `--ttl-s`, or per model glob (`model_ttl_s`), in every
store and every copy of it: the in-process store, Redis, and a replica's near cache, which
must not serve an entry past its end however long it keeps copies."""
from __future__ import annotations

import time

import orjson
import pytest
import redis

from gateway.cache.entry import Sealer
from gateway.cache.redis_store import entry_name
from gw_http import CHAT, post, serve_args

TTL_S = 0.6


def caches(url: str, body: dict = CHAT) -> list[str]:
    return [post(url, "/v1/chat/completions", body).cache for _ in range(2)]


@pytest.mark.parametrize("store", ["memory", "redis", "redis+near cache"])
def test_an_entry_ages_out_and_is_asked_for_again(upstream, gateway, redis_url, store):
    fake, _ = upstream
    settings = {"ttl_s": TTL_S}
    if store != "memory":
        # A near cache that would keep its copy for a minute, were the entry's end not its limit.
        settings.update(redis_url=redis_url, near_cache_ttl_s=60 if store == "redis+near cache" else 0)
    gw = gateway(**settings)
    first = post(gw.url, "/v1/chat/completions", CHAT)
    assert (first.cache, post(gw.url, "/v1/chat/completions", CHAT).cache) == ("miss", "hit")
    time.sleep(TTL_S + 0.2)
    later = post(gw.url, "/v1/chat/completions", CHAT)
    assert later.cache == "miss" and later.body != first.body  # a fresh answer from the upstream
    assert post(gw.url, "/v1/chat/completions", CHAT).body == later.body
    assert len(fake.calls) == 2


def test_the_first_matching_model_glob_sets_the_ttl(upstream, gateway):
    fake, _ = upstream
    gw = gateway(ttl_s=0, model_ttl_s={"m1*": TTL_S, "m*": 0})
    short = {**CHAT, "model": "fake/m1"}
    kept = {**CHAT, "model": "fake/m2"}
    assert caches(gw.url, short) == ["miss", "hit"] and caches(gw.url, kept) == ["miss", "hit"]
    time.sleep(TTL_S + 0.2)
    assert post(gw.url, "/v1/chat/completions", short).cache == "miss"
    assert post(gw.url, "/v1/chat/completions", kept).cache == "hit"
    assert len(fake.calls) == 3


def test_detgate_serve_flags_set_the_ttl_in_redis_and_in_the_sealed_entry(upstream, redis_url, gateway_process):
    _, url = upstream
    gw = gateway_process(serve_args(url, redis_url, "--ttl-s", "600", "--model-ttl-s", "e1*=30"))
    chat = post(gw.url, "/v1/chat/completions", CHAT)
    embedding = post(gw.url, "/v1/embeddings", {"model": "fake/e1", "input": "x"})
    store = redis.Redis.from_url(redis_url)
    for reply, ttl_s in ((chat, 600), (embedding, 30)):
        assert ttl_s - 5 < store.pttl(entry_name(reply.key)) / 1000 <= ttl_s
        record = orjson.loads(store.get(entry_name(reply.key))[Sealer.MAC_LEN:])
        assert ttl_s - 5 < record["expires_ms"] / 1000 - time.time() <= ttl_s
    store.close()


def test_ttl_settings_refuse_negative_seconds(gateway):
    with pytest.raises(ValueError, match="ttl_s"):
        gateway(ttl_s=-1)
    with pytest.raises(ValueError, match="model_ttl_s"):
        gateway(model_ttl_s={"gpt-4o*": -5})


def test_store_rules_come_from_the_file_the_environment_and_flags(tmp_path):
    from gateway import cli, config

    file = tmp_path / "detgate.toml"
    file.write_text('ttl_s = 60\nstore_finish = ["stop"]\n[model_ttl_s]\n"gpt-4o*" = 5\n"*" = 0\n')
    settings = config.load(str(file), {"DETGATE_STORE_FINISH": "stop,content_filter"}, {})
    assert settings.store_finish == ("stop", "content_filter") and settings.ttl_s == 60
    assert list(settings.model_ttl_s.items()) == [("gpt-4o*", 5), ("*", 0)]  # in the file's order: first match wins
    settings = config.load(None, {"DETGATE_MODEL_TTL_S": "e1*=30"}, {"ttl_s": 1.5})
    assert settings.model_ttl_s == {"e1*": 30} and settings.ttl_s == 1.5
    args = cli.build_parser().parse_args(["serve", "--store-finish", "stop", "--store-finish", "length",
                                          "--ttl-s", "5", "--model-ttl-s", "m*=1"])
    assert (args.store_finish, args.ttl_s, args.model_ttl_s) == (["stop", "length"], 5.0, ["m*=1"])
