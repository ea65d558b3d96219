"""The official openai client against the gateway: repeated requests give identical bytes."""
from __future__ import annotations

import openai
import orjson

from gw_http import CHAT, client, post, sse_payloads

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def test_sync_client_gets_the_same_bytes_every_time(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    api = client(gw.url)
    replies = [api.chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES) for _ in range(3)]
    assert [r.headers["x-detgate-cache"] for r in replies] == ["miss", "hit", "hit"]
    assert len({r.http_response.content for r in replies}) == 1
    assert len({r.headers["x-detgate-key"] for r in replies}) == 1
    assert replies[0].headers["x-detgate-model-version"] == "m1-fake-0001"
    assert len(fake.calls) == 1
    # The upstream was sent the model without the routing prefix.
    assert fake.calls[0][1]["model"] == "m1"
    completion = replies[2].parse()
    assert completion.choices[0].message.content


async def test_async_client_gets_the_same_bytes_every_time(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    api = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    first = await api.completions.with_raw_response.create(model="fake/m1", prompt="Once upon a time")
    second = await api.completions.with_raw_response.create(model="fake/m1", prompt="Once upon a time")
    assert (first.headers["x-detgate-cache"], second.headers["x-detgate-cache"]) == ("miss", "hit")
    assert first.http_response.content == second.http_response.content
    embedded = [await api.embeddings.with_raw_response.create(model="fake/e1", input=["a", "b"]) for _ in range(2)]
    assert embedded[0].http_response.content == embedded[1].http_response.content
    assert len((embedded[1].parse()).data) == 2
    assert len(fake.calls) == 2
    await api.close()


def _stream_text(api: openai.OpenAI, **kwargs) -> tuple[str, str, list[str]]:
    raw = api.chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES, stream=True, **kwargs)
    pieces = [chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices]
    return raw.headers["x-detgate-cache"], "".join(pieces), pieces


def test_streaming_miss_then_replay(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    first = _stream_text(api)
    second = _stream_text(api)
    assert (first[0], second[0]) == ("miss", "hit")
    assert first[1] == second[1] and first[2] == second[2]  # same text, same chunking
    assert len(fake.calls) == 1 and fake.calls[0][1]["stream"] is True


def test_stream_recorded_live_replays_byte_identically(upstream, gateway):
    gw = gateway()
    body = {**CHAT, "stream": True}
    live = post(gw.url, "/v1/chat/completions", body)
    replays = [post(gw.url, "/v1/chat/completions", body) for _ in range(2)]
    assert live.cache == "miss" and [r.cache for r in replays] == ["hit", "hit"]
    assert live.headers["content-type"].startswith("text/event-stream")
    assert replays[0].body == replays[1].body
    # The live pass-through carried exactly the events the replay serves.
    assert live.body == replays[0].body
    assert sse_payloads(live.body)[-1] == b"[DONE]"


def test_non_stream_answer_serves_a_later_stream(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    stored = api.chat.completions.create(model="fake/m1", messages=MESSAGES)
    cache, text, _ = _stream_text(api)
    assert cache == "hit"
    assert text == stored.choices[0].message.content
    assert len(fake.calls) == 1


def test_stream_answer_serves_a_later_non_stream(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    api = client(gw.url)
    _, text, _ = _stream_text(api)
    replies = [post(gw.url, "/v1/chat/completions", {**CHAT, "messages": MESSAGES}) for _ in range(2)]
    assert [r.cache for r in replies] == ["hit", "hit"]
    assert replies[0].body == replies[1].body
    body = replies[0].json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text, "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert len(fake.calls) == 1


def test_stream_with_usage_assembles_usage(upstream, gateway):
    gw = gateway()
    api = client(gw.url)
    _stream_text(api, stream_options={"include_usage": True})
    body = post(gw.url, "/v1/chat/completions", {**CHAT, "messages": MESSAGES}).json()
    assert body["usage"]["completion_tokens"] == len(body["choices"][0]["message"]["content"].split())


def test_equivalent_requests_share_one_entry(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    plain = post(gw.url, "/v1/chat/completions", {"model": "fake/m1", "messages": [{"role": "user", "content": "Café"}],
                                                 "temperature": 1})
    # Decomposed é, CRLF-free, a single text part, 1.0 for 1, a `user` field and a null optional field.
    dirty = post(gw.url, "/v1/chat/completions", {
        "model": "fake/m1", "temperature": 1.0, "user": "someone", "n": None,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Cafe\u0301"}]}]})
    assert (plain.cache, dirty.cache) == ("miss", "hit")
    assert plain.body == dirty.body and plain.key == dirty.key
    assert len(fake.calls) == 1


def test_models_and_allow_listed_v1_paths_are_proxied_uncached(upstream, gateway):
    _, url = upstream
    gw = gateway(upstreams=[{"name": "fake", "url": url, "proxy": ["GET /models", "POST /echo/{what}"]}])
    api = client(gw.url)
    assert [m.id for m in api.models.list()] == ["fake-model"]
    echoed = post(gw.url, "/v1/echo/files?purpose=x", b"payload")
    assert echoed.status == 200
    assert orjson.loads(echoed.body) | {"authorization": None} == {
        "method": "POST", "path": "/v1/echo/files", "query": {"purpose": "x"}, "authorization": None, "body": "payload"}
