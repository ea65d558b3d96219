"""The fake provider with faults, as the load + fault run uses it: each fault really happens."""
import asyncio
import collections
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from fakes.fault_upstream import FaultUpstream
from fakes.faults import FaultPlan

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def read_stream(response):
    """The SSE data payloads of a stream, in order, and the sizes of the network reads."""
    events, reads, buf = [], [], b""
    async for piece in response.content.iter_any():
        reads.append(len(piece))
        buf += piece
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            events.append(event.removeprefix(b"data: "))
    return events, reads


async def test_healthy_answers_differ_every_call_like_a_real_provider():
    async with FaultUpstream(seed=1) as up, aiohttp.ClientSession() as http:
        bodies = []
        for _ in range(5):
            async with http.post(f"{up.url}/chat/completions", json=CHAT) as r:
                assert r.status == 200
                bodies.append(await r.json())
        chunkings, texts = set(), set()
        for _ in range(5):
            async with http.post(f"{up.url}/chat/completions", json={**CHAT, "stream": True}) as r:
                events, _ = await read_stream(r)
            assert events[-1] == b"[DONE]"
            deltas = [orjson.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]]
            chunkings.add(tuple(len(d) for d in deltas))
            texts.add("".join(deltas))
    assert len({b["id"] for b in bodies}) == 5
    assert len({b["choices"][0]["message"]["content"] for b in bodies}) == 5
    assert len(chunkings) == 5 and len(texts) == 5


async def test_random_faults_follow_the_weights_and_the_seed():
    plan = FaultPlan(weights={"ok": 2, "500": 1, "429": 1}, retry_after=0)
    statuses = []
    for _ in range(2):
        async with FaultUpstream(plan, seed=42) as up, aiohttp.ClientSession() as http:
            run = []
            for _ in range(200):
                async with http.post(f"{up.url}/chat/completions", json=CHAT) as r:
                    run.append(r.status)
            statuses.append(run)
            assert up.served == collections.Counter(
                {"ok": run.count(200), "500": run.count(500), "429": run.count(429)})
    assert statuses[0] == statuses[1]  # same seed, same sequence of faults
    counts = collections.Counter(statuses[0])
    assert 70 < counts[200] < 130 and 25 < counts[500] < 75 and 25 < counts[429] < 75


async def test_a_broken_stream_ends_without_done():
    async with FaultUpstream(seed=3) as up, aiohttp.ClientSession() as http:
        up.script.append("broken")
        async with http.post(f"{up.url}/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await read_stream(r)


async def test_a_stall_goes_silent_mid_stream():
    plan = FaultPlan(stall_s=0.6)
    async with FaultUpstream(plan, seed=4) as up, aiohttp.ClientSession() as http:
        up.script.append("stall")
        async with http.post(f"{up.url}/chat/completions", json={**CHAT, "stream": True}) as r:
            first = await r.content.readuntil(b"\n\n")
            assert first.startswith(b"data: {")
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):  # what a gateway read timeout does
                    await read_stream(r)


async def test_slow_first_byte_then_a_normal_answer():
    plan = FaultPlan(slow_first_byte_s=0.2)
    async with FaultUpstream(plan, seed=5) as up, aiohttp.ClientSession() as http:
        up.script.append("slow_first_byte")
        start = time.monotonic()
        async with http.post(f"{up.url}/completions", json={"model": "m", "prompt": "p"}) as r:
            body = await r.json()
        assert time.monotonic() - start >= 0.2
        assert r.status == 200 and body["choices"][0]["text"]


async def test_a_429_carries_retry_after_and_an_openai_shaped_error():
    async with FaultUpstream(FaultPlan(retry_after=2), seed=6) as up, aiohttp.ClientSession() as http:
        up.script.extend(["429", "500"])
        async with http.post(f"{up.url}/embeddings", json={"model": "e", "input": ["a", "b"]}) as r:
            assert r.status == 429 and r.headers["Retry-After"] == "2"
            assert set((await r.json())["error"]) == {"message", "type", "param", "code"}
        async with http.post(f"{up.url}/embeddings", json={"model": "e", "input": ["a", "b"]}) as r:
            assert r.status == 500
        async with http.post(f"{up.url}/embeddings", json={"model": "e", "input": ["a", "b"]}) as r:
            assert r.status == 200 and len((await r.json())["data"]) == 2


def test_runs_as_its_own_process_for_load_runs():
    script = Path(__file__).resolve().parents[1] / "fakes" / "fault_upstream.py"
    proc = subprocess.Popen([sys.executable, str(script), "--seed", "1",
                             "--weights", "ok=1,500=1"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://\S+", line).group(0)

        async def probe():
            async with aiohttp.ClientSession() as http:
                codes = set()
                for _ in range(20):
                    async with http.post(f"{url}/chat/completions", json=CHAT) as r:
                        codes.add(r.status)
                return codes

        assert asyncio.run(probe()) == {200, 500}
    finally:
        proc.terminate()
        proc.wait(5)
