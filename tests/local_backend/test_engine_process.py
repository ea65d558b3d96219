"""The engine as the CLI runs it, in a process of its own: it serves what the in-thread engine
serves, its numbers reach /metrics, a client that leaves frees its sequence there, and an
engine process that dies fails the requests waiting on it instead of leaving them hanging."""
from __future__ import annotations

import asyncio
import json
import os
import signal

import aiohttp
import openai
import pytest

from conftest import Server, metric
from local_backend.config import EngineConfig
from local_backend.engine.engine_process import EngineProcess

BODIES = [dict(prompt="Deterministic answers", max_tokens=12, temperature=0, logprobs=2),
          dict(prompt="The quick brown fox", max_tokens=20, temperature=0.8, seed=7, logprobs=1),
          dict(prompt="A paged cache holds", max_tokens=16, temperature=0.9, top_k=20, seed=3)]


@pytest.fixture
def engine_process(checkpoints):
    process = EngineProcess(EngineConfig(model=str(checkpoints["qwen3"]), device="cpu", max_model_len=256),
                            "%(processName)s %(message)s")
    yield process
    process.stop()   # again, after its server's: the process is gone, and stop says nothing of it


async def answers(server: Server) -> list:
    async def one(body, stream):
        extra = {k: body[k] for k in ("top_k",) if k in body}
        rest = {k: v for k, v in body.items() if k != "top_k"}
        if not stream:
            r = await server.client.completions.create(model="qwen3", extra_body={"ignore_eos": True, **extra}, **rest)
            return r.choices[0].text, r.choices[0].logprobs and r.choices[0].logprobs.token_logprobs
        text, logprobs = "", []
        async for chunk in await server.client.completions.create(
                model="qwen3", stream=True, extra_body={"ignore_eos": True, **extra}, **rest):
            text += chunk.choices[0].text
            if chunk.choices[0].logprobs:
                logprobs += chunk.choices[0].logprobs.token_logprobs
        return text, logprobs or None
    return await asyncio.gather(*(one(b, stream) for b in BODIES * 3 for stream in (False, True)))


async def test_the_process_serves_the_thread_s_bits_and_its_metrics(engines, engine_process):
    async with Server(engines["qwen3"], "qwen3") as thread:
        expected = await answers(thread)
        fingerprint = (await thread.client.models.list()).data[0].system_fingerprint
    async with Server(engine_process, "qwen3") as process:
        assert (await process.client.models.list()).data[0].system_fingerprint == fingerprint
        before = await metric(process.url, "detgate_backend_generation_tokens_total")
        assert await answers(process) == expected
        generated = await metric(process.url, "detgate_backend_generation_tokens_total") - before
        assert generated == 2 * 3 * sum(b["max_tokens"] for b in BODIES)
        assert await metric(process.url, "detgate_backend_batch_size_count") > 0
        assert await metric(process.url, "detgate_backend_kv_blocks_used") == 0


async def test_a_client_that_leaves_frees_its_sequence_in_the_process(engine_process):
    async with Server(engine_process, "qwen3") as s:
        body = {"model": "qwen3", "prompt": "hello", "max_tokens": 240, "stream": True, "ignore_eos": True}
        before = await metric(s.url, "detgate_backend_generation_tokens_total")
        async with aiohttp.ClientSession() as http:
            async with http.post(s.url + "/v1/completions", json=body) as r:
                assert r.status == 200
                await r.content.readline()
        await asyncio.sleep(0.5)
        ok = await s.client.completions.create(model="qwen3", prompt="hi", max_tokens=2)   # the metrics catch up
        assert ok.choices[0].text is not None
        assert await metric(s.url, "detgate_backend_kv_blocks_used") == 0
        assert await metric(s.url, "detgate_backend_generation_tokens_total") - before < 200


async def test_a_dead_engine_process_fails_its_requests_and_says_so(engine_process):
    async with Server(engine_process, "qwen3") as s:
        body = dict(model="qwen3", prompt="hello", max_tokens=240, extra_body={"ignore_eos": True})
        stream = await s.client.completions.create(stream=True, **body)
        await anext(stream)
        waiting = asyncio.ensure_future(s.client.completions.create(**body))
        await asyncio.sleep(0.1)
        os.kill(engine_process.pid, signal.SIGKILL)
        with pytest.raises(openai.APIError, match="the engine process exited"):
            async with asyncio.timeout(10):
                async for _ in stream:
                    pass
        with pytest.raises(openai.InternalServerError) as failed:
            await asyncio.wait_for(waiting, 10)
        assert failed.value.body["type"] == "server_error"
        with pytest.raises(openai.InternalServerError) as refused:
            await s.client.completions.create(**body)
        assert refused.value.status_code == 503
        async with aiohttp.ClientSession() as http:
            async with http.get(s.url + "/healthz") as r:
                assert r.status == 503
                assert (await r.json())["last_error"] == "the engine process exited"


async def test_constrained_requests_through_the_process_equal_the_thread_s(engines, engine_process):
    """The grammar travels in the request to the engine's process, which compiles it there."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}

    async def ask(server):
        c = await server.client.completions.create(model="qwen3", prompt="pick", max_tokens=8, seed=4, temperature=1.0,
                                                   extra_body={"guided_choice": ["red", "green", "blue"]})
        r = await server.client.chat.completions.create(
            model="qwen3", messages=[{"role": "user", "content": "n?"}], max_tokens=20, seed=4, temperature=1.0,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        return c.choices[0].text, r.choices[0].message.content

    async with Server(engines["qwen3"], "qwen3") as thread:
        expected = await ask(thread)
    async with Server(engine_process, "qwen3") as process:
        assert await ask(process) == expected
    assert expected[0] in ("red", "green", "blue") and set(json.loads(expected[1])) == {"n"}
