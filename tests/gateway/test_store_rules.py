"""Only real answers are stored (issue 22 §3). A 200 that holds an error or no answer, a
stream that reaches [DONE] with a choice unfinished, one that ends in vLLM's `abort`, one
with an error event: each is passed on as a failure, nothing is written to the store, and
the next identical request is a miss. Complete answers are kept by their finish class as
`store_finish` says; one it declines is served with a warning and asked for again next
time. Real Redis, the official openai client, real HTTP."""
from __future__ import annotations

import asyncio

import openai
import pytest
import redis

from gw_http import CHAT, client, post, post_all, samples, value

ROUTES = {
    "chat": ("/v1/chat/completions", CHAT),
    "completions": ("/v1/completions", {"model": "fake/m1", "prompt": "Once upon a time"}),
    "embeddings": ("/v1/embeddings", {"model": "fake/e1", "input": "vectors"}),
}
STREAMED = ("chat", "completions")
# What each broken answer looks like to the client: its status and error code.
BROKEN = {
    "error_200": (502, "fake"),  # the upstream's own error object, passed on as it came
    "empty": (502, "upstream_invalid_answer"),
    "unfinished": (502, "upstream_invalid_answer"),
    "abort": (502, "upstream_invalid_answer"),
}


def entries(redis_url: str) -> list[bytes]:
    store = redis.Redis.from_url(redis_url)
    try:
        return store.keys("detgate:e:*")
    finally:
        store.close()


def _break(fake, how: str) -> None:
    if how == "abort":
        fake.behaviour.finish = "abort"  # vLLM: the request was cancelled mid-way
    else:
        setattr(fake.behaviour, how, True)


def _cases():
    for route in ROUTES:
        for how in BROKEN:
            if route == "embeddings" and how in ("unfinished", "abort"):
                continue  # embeddings have no finish
            for stream in (False, True) if route in STREAMED else (False,):
                yield pytest.param(route, how, stream, id=f"{route}-{how}-{'stream' if stream else 'body'}")


@pytest.mark.parametrize("route,how,stream", list(_cases()))
def test_a_broken_answer_fails_is_never_stored_and_the_next_request_asks_again(upstream, gateway, redis_url,
                                                                             route, how, stream):
    fake, _ = upstream
    gw = gateway(redis_url=redis_url, near_cache_ttl_s=0)
    path, body = ROUTES[route]
    body = {**body, "stream": True} if stream else body
    _break(fake, how)
    failed = post(gw.url, path, body)
    status, code = BROKEN[how]
    if stream and how in ("unfinished", "abort"):
        # The frames had gone out live before the end showed the answer incomplete: the
        # failure is told in-band, as providers tell theirs.
        assert failed.status == 200 and failed.body.endswith(b"\n\n") and b"[DONE]" not in failed.body
        assert f'"code":"{code}"'.encode() in failed.body.rsplit(b"data: ", 1)[1]
    else:
        assert failed.status == status and failed.json()["error"]["code"] == code, failed.body
    assert entries(redis_url) == []
    fake.behaviour = type(fake.behaviour)()
    again = post(gw.url, path, body)
    assert (again.status, again.cache) == (200, "miss")
    assert post(gw.url, path, body).cache == "hit"
    assert len(fake.calls) == 2


def test_an_error_event_mid_stream_reaches_the_sdk_and_stores_nothing(upstream, gateway, redis_url):
    fake, _ = upstream
    fake.behaviour.error_after = 3
    gw = gateway(redis_url=redis_url)
    api = client(gw.url)
    ask = dict(model="fake/m1", messages=CHAT["messages"], stream=True)
    with pytest.raises(openai.APIError, match="fake failure"):
        for _ in api.chat.completions.create(**ask):
            pass
    assert entries(redis_url) == []
    fake.behaviour.error_after = None
    caches = []
    for _ in range(2):
        stream = api.chat.completions.create(**ask)
        assert list(stream)[-1].choices[0].finish_reason == "stop"  # read to its end before the next
        caches.append(stream.response.headers["x-detgate-cache"])
    assert caches == ["miss", "hit"]
    assert len(fake.calls) == 2


def test_length_is_kept_and_content_filter_is_served_warned_and_asked_again(upstream, gateway, redis_url):
    fake, _ = upstream
    gw = gateway(redis_url=redis_url)
    api = client(gw.url)
    cut = [api.completions.with_raw_response.create(model="fake/m1", prompt="Long", max_tokens=5) for _ in range(2)]
    assert [r.headers["x-detgate-cache"] for r in cut] == ["miss", "hit"]
    assert cut[1].parse().choices[0].finish_reason == "length"
    fake.behaviour.finish = "content_filter"
    ask = dict(model="fake/m1", messages=[{"role": "user", "content": "Something filtered."}])
    filtered = [api.chat.completions.with_raw_response.create(**ask) for _ in range(2)]
    assert [r.headers["x-detgate-cache"] for r in filtered] == ["miss", "miss"]
    assert all("answer not stored: finish_reason class content_filter" in r.headers["x-detgate-warnings"]
               for r in filtered)
    assert filtered[0].parse().choices[0].finish_reason == "content_filter"
    assert len(fake.calls) == 3 and len(entries(redis_url)) == 1
    assert value(samples(gw.url), "detgate_cache_declined_total", finish="content_filter") == 2


def test_everyone_waiting_on_a_declined_answer_gets_it(upstream, gateway, redis_url):
    fake, _ = upstream
    fake.behaviour.finish = "content_filter"
    fake.behaviour.delay_s = 0.5
    gw = gateway(redis_url=redis_url)
    results = asyncio.run(post_all([gw.url] * 4, CHAT))
    assert sorted(cache for cache, _ in results) == ["coalesced"] * 3 + ["miss"]
    assert len({raw for _, raw in results}) == 1 and fake.started == 1
    assert entries(redis_url) == []


def test_a_declined_stream_goes_out_live_and_is_not_replayed(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.finish = "content_filter"
    gw = gateway()
    api = client(gw.url)
    ask = dict(model="fake/m1", messages=CHAT["messages"], stream=True)
    for _ in range(2):
        chunks = list(api.chat.completions.create(**ask))
        assert chunks[-1].choices[0].finish_reason == "content_filter"
    assert len(fake.calls) == 2


@pytest.mark.parametrize("finishes,stored", [(["stop"], {"stop"}),
                                             (["stop", "length", "content_filter"], {"stop", "length", "content_filter"})])
def test_store_finish_chooses_the_classes_kept(upstream, gateway, finishes, stored):
    fake, _ = upstream
    gw = gateway(store_finish=finishes)
    for finish in ("stop", "length", "content_filter"):
        fake.behaviour.finish = finish
        body = {**CHAT, "messages": [{"role": "user", "content": f"Ends with {finish}."}]}
        caches = [post(gw.url, "/v1/chat/completions", body).cache for _ in range(2)]
        assert caches == (["miss", "hit"] if finish in stored else ["miss", "miss"]), finish


def test_store_finish_refuses_what_is_not_a_finish_class(upstream, gateway):
    with pytest.raises(ValueError, match="store_finish"):
        gateway(store_finish=["stop", "tool_calls"])
