"""Every reader of an entry gets the shape it asked for, and the same bytes every time
(issue 22 §2): the usage chunk only for a stream that asked for it (whoever filled the
entry, and however), `usage` always in a body, and a live miss byte-identical to every
later replay of the same view. Official openai client, real HTTP, a fake that streams
usage only when asked, as OpenAI does."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from gw_http import client, post, sse_payloads

USAGE = {"include_usage": True}
ROUTES = {
    "chat": ("/v1/chat/completions", {"model": "fake/m1", "messages": [{"role": "user", "content": "Tell a tale."}]}),
    "completions": ("/v1/completions", {"model": "fake/m1", "prompt": "Once upon a time"}),
}
# The shapes a request can ask for: a body, a plain stream, a stream with the usage chunk.
VIEWS = {"body": {}, "stream": {"stream": True}, "usage": {"stream": True, "stream_options": USAGE}}


def chunks_of(raw: bytes) -> list[dict]:
    payloads = sse_payloads(raw)
    assert payloads[-1] == b"[DONE]"
    return [orjson.loads(p) for p in payloads[:-1]]


def test_a_stream_filled_with_include_usage_never_crashes_a_plain_loop(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    api = client(gw.url)
    messages = [{"role": "user", "content": "Stream with usage."}]
    filled = api.chat.completions.create(model="fake/m1", messages=messages, stream=True, stream_options=USAGE)
    assert filled.response.headers["x-detgate-cache"] == "miss"
    assert list(filled)[-1].usage is not None  # the filler got what it asked for
    plain = api.chat.completions.create(model="fake/m1", messages=messages, stream=True)
    assert plain.response.headers["x-detgate-cache"] == "hit"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in plain)  # no IndexError
    raw = post(gw.url, "/v1/chat/completions", {"model": "fake/m1", "messages": messages, "stream": True})
    assert raw.cache == "hit" and b'"usage"' not in raw.body
    assert len(fake.calls) == 1


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("filler", ["body", "stream"])
def test_a_reader_that_asks_for_usage_gets_it_whatever_filled_the_entry(upstream, gateway, route, filler):
    fake, _ = upstream
    gw = gateway()
    path, body = ROUTES[route]
    assert post(gw.url, path, {**body, **VIEWS[filler]}).cache == "miss"
    # The gateway asks for usage whatever the client asked: a stream's entry has it too.
    assert fake.calls[0][1].get("stream_options") == (USAGE if filler == "stream" else None)
    usage_reader = post(gw.url, path, {**body, **VIEWS["usage"]})
    last = chunks_of(usage_reader.body)[-1]
    assert usage_reader.cache == "hit" and last["choices"] == [] and last["usage"]["total_tokens"] > 0
    # A body assembled from a stream that was asked for no usage still has it, the same numbers.
    whole = post(gw.url, path, body)
    assert whole.cache == "hit" and whole.json()["usage"] == last["usage"]
    assert len(fake.calls) == 1


def test_the_sdk_reads_usage_from_a_replayed_stream(upstream, gateway):
    api = client(gateway().url)
    path, body = ROUTES["completions"]
    whole = api.completions.create(**body)  # fills the entry without any stream
    chunks = list(api.completions.create(**body, stream=True, stream_options=USAGE))
    assert chunks[-1].usage == whole.usage and chunks[-1].choices == []
    assert all(chunk.choices for chunk in chunks[:-1])


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("first", VIEWS)
def test_each_view_gets_one_byte_string_on_the_miss_and_every_hit(upstream, gateway, route, first):
    """Counted, not assumed: N requests per view, one distinct body per view, the live miss
    included; and a view's bytes never depend on which view filled the entry."""
    fake, _ = upstream
    gw = gateway()
    path, body = ROUTES[route]
    bodies: dict[str, set[bytes]] = {view: set() for view in VIEWS}
    miss = post(gw.url, path, {**body, **VIEWS[first]})
    assert miss.status == 200 and miss.cache == "miss"
    bodies[first].add(miss.body)
    for _ in range(4):
        for view, extra in VIEWS.items():
            reply = post(gw.url, path, {**body, **extra})
            assert reply.cache == "hit"
            bodies[view].add(reply.body)
    assert {view: len(seen) for view, seen in bodies.items()} == {"body": 1, "stream": 1, "usage": 1}
    plain, usage = bodies["stream"].pop(), bodies["usage"].pop()
    assert usage.startswith(plain[:-len(b"data: [DONE]\n\n")])  # the usage chunk is the only difference
    assert len(fake.calls) == 1


@pytest.mark.parametrize("route", ROUTES)
async def test_readers_sharing_one_live_call_each_get_their_view(upstream, gateway, route):
    """Three requests joined on one upstream call while it streams: each view's live bytes
    equal its later replay."""
    fake, _ = upstream
    fake.behaviour.delay_s = 0.5  # long enough for all three to join before the first byte
    fake.behaviour.chunk_delay_s = 0.01
    gw = gateway()
    path, body = ROUTES[route]
    async with aiohttp.ClientSession() as session:
        async def ask(extra: dict) -> tuple[str, bytes]:
            async with session.post(gw.url + path, data=orjson.dumps({**body, **extra})) as reply:
                assert reply.status == 200
                return reply.headers["x-detgate-cache"], await reply.read()

        live = await asyncio.gather(*(ask(extra) for extra in VIEWS.values()))
        replays = await asyncio.gather(*(ask(extra) for extra in VIEWS.values()))
    assert sorted(cache for cache, _ in live) == ["coalesced", "coalesced", "miss"]
    assert [cache for cache, _ in replays] == ["hit"] * 3
    assert [raw for _, raw in live] == [raw for _, raw in replays]
    assert fake.started == 1
