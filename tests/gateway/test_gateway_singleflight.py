"""Concurrent identical requests in one process make one upstream call."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson

from gw_http import CHAT, post, sse_payloads


async def _fire(url: str, body: dict, n: int) -> list[tuple[str, bytes]]:
    async with aiohttp.ClientSession() as session:
        async def one():
            async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body)) as r:
                assert r.status == 200, await r.text()
                return r.headers["x-detgate-cache"], await r.read()
        return await asyncio.gather(*(one() for _ in range(n)))


async def test_twenty_concurrent_identical_requests_make_one_call(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.delay_s = 1.0  # keep the first call in the air while the others arrive
    gw = gateway()
    results = await _fire(gw.url, CHAT, 20)
    assert fake.started == 1
    assert sorted(c for c, _ in results) == ["coalesced"] * 19 + ["miss"]
    assert len({body for _, body in results}) == 1
    assert post(gw.url, "/v1/chat/completions", CHAT).body == results[0][1]


async def test_concurrent_streams_share_one_live_call(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.delay_s = 1.0
    fake.behaviour.chunk_delay_s = 0.002
    gw = gateway()
    results = await _fire(gw.url, {**CHAT, "stream": True}, 8)
    assert fake.started == 1
    assert len({body for _, body in results}) == 1  # every reader followed the same events
    assert sse_payloads(results[0][1])[-1] == b"[DONE]"


async def test_mixed_stream_and_plain_waiters_share_one_call(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.delay_s = 1.0
    gw = gateway()
    streams, plains = await asyncio.gather(_fire(gw.url, {**CHAT, "stream": True}, 3), _fire(gw.url, CHAT, 3))
    assert fake.started == 1
    assert len({b for _, b in streams}) == 1 and len({b for _, b in plains}) == 1
    text = "".join(orjson.loads(p)["choices"][0]["delta"].get("content", "")
                   for p in sse_payloads(streams[0][1])[:-1])
    assert orjson.loads(plains[0][1])["choices"][0]["message"]["content"] == text


async def test_client_disconnect_neither_cancels_nor_spoils_the_shared_call(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.chunk_delay_s = 0.005
    gw = gateway()
    body = orjson.dumps({**CHAT, "stream": True})
    async with aiohttp.ClientSession() as session:
        response = await session.post(gw.url + "/v1/chat/completions", data=body)
        await response.content.readany()  # some live bytes arrived
        response.close()  # and the client walks away mid-stream
    for _ in range(200):  # the call goes on without it and is stored once complete
        reply = post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True},
                     headers={"x-detgate-cache-control": "only-if-cached"})
        if reply.status == 200:
            break
        await asyncio.sleep(0.05)
    assert reply.status == 200 and reply.cache == "hit"
    assert sse_payloads(reply.body)[-1] == b"[DONE]"
    assert fake.started == 1
