"""`--mode record` and `--mode replay`: gateways sharing one real Redis, one recording
or serving normally, one replaying, with the official openai client where it matters."""
from __future__ import annotations

import openai
import pytest

from gw_http import CHAT, client, post, sse_payloads

GOODBYE = {**CHAT, "messages": [{"role": "user", "content": "Say goodbye."}]}


def pair(gateway, redis_url, mode: str):
    """(a normal gateway, one in `mode`), on the same Redis and secret."""
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    return gateway(**shared), gateway(mode=mode, **shared)


def test_replay_serves_what_was_recorded_and_never_calls_upstream(upstream, gateway, redis_url):
    fake, _ = upstream
    normal, replay = pair(gateway, redis_url, "replay")
    recorded = post(normal.url, "/v1/chat/completions", CHAT)
    streamed = post(normal.url, "/v1/chat/completions", {**CHAT, "stream": True})
    calls = len(fake.calls)
    hit = post(replay.url, "/v1/chat/completions", CHAT)
    assert (hit.status, hit.cache, hit.key, hit.body) == (200, "hit", recorded.key, recorded.body)
    replayed_stream = post(replay.url, "/v1/chat/completions", {**CHAT, "stream": True})
    assert replayed_stream.cache == "hit" and replayed_stream.body == streamed.body
    assert sse_payloads(replayed_stream.body)[-1] == b"[DONE]"

    miss = post(replay.url, "/v1/chat/completions", GOODBYE)
    assert miss.status == 400  # not 404, which agents read as a model error (issue 40 §4)
    error = miss.json()["error"]
    assert error["code"] == "replay_miss" and set(error) == {"message", "type", "param", "code"}
    assert miss.key in error["message"] and '"content":"Say goodbye."' in error["message"]
    for control in ("no-store", "no-cache"):  # no way around it to the upstream
        assert post(replay.url, "/v1/chat/completions", GOODBYE,
                    {"x-detgate-cache-control": control}).status == 400
    assert len(fake.calls) == calls


def test_a_replay_miss_hint_is_truncated(upstream, gateway, redis_url):
    _, replay = pair(gateway, redis_url, "replay")
    long = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    message = post(replay.url, "/v1/chat/completions", long).json()["error"]["message"]
    assert len(message) < 1000 and "characters)" in message


def test_replay_through_the_openai_client(upstream, gateway, redis_url):
    normal, replay = pair(gateway, redis_url, "replay")
    recorded, replaying = client(normal.url), client(replay.url)
    first = recorded.chat.completions.create(model="fake/m1", messages=CHAT["messages"])
    again = replaying.chat.completions.create(model="fake/m1", messages=CHAT["messages"])
    assert again.model_dump() == first.model_dump()
    with pytest.raises(openai.BadRequestError) as caught:
        replaying.chat.completions.create(model="fake/m1", messages=GOODBYE["messages"])
    assert caught.value.code == "replay_miss"


def test_record_always_calls_upstream_and_overwrites(upstream, gateway, redis_url):
    fake, _ = upstream
    normal, record = pair(gateway, redis_url, "record")
    old = post(normal.url, "/v1/chat/completions", CHAT)
    first = post(record.url, "/v1/chat/completions", CHAT)
    second = post(record.url, "/v1/chat/completions", CHAT)
    assert first.cache == second.cache == "miss" and len(fake.calls) == 3
    assert len({old.body, first.body, second.body}) == 3  # the fake never answers the same twice
    served = post(normal.url, "/v1/chat/completions", CHAT)
    assert (served.cache, served.body) == ("hit", second.body)  # the latest recording is what is kept
