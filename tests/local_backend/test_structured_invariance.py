"""Constrained requests (a JSON schema, a required tool call) under load on the CPU path: a
constrained row gives the same tokens alone and in a batch of constrained and free rows, and
N identical constrained requests at once give 1 unique answer, greedy and seeded. Off a GPU the
reference matmul may round a row's logits differently by batch size (test_invariance.py), so
tokens are compared exactly and logprobs closely here; bench/backend_structured.py compares
bits on the GPU."""
from __future__ import annotations

import asyncio
import json

import pytest

from conftest import Server, make_engine

SCHEMA = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 10},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["word", "n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}


async def constrained(client, i: int, **params):
    r = await client.chat.completions.create(
        model="qwen3", messages=[{"role": "user", "content": f"{i} give me a word"}], max_tokens=60,
        response_format=FORMAT, logprobs=True, **params)
    c = r.choices[0]
    return c.message.content, [e.logprob for e in c.logprobs.content], c.finish_reason


async def free(client, i: int):
    r = await client.chat.completions.create(
        model="qwen3", messages=[{"role": "user", "content": f"{i} the quick brown fox " * (i % 3 + 1)}],
        max_tokens=20 + i, temperature=0.9, seed=i, logprobs=True)
    return r.choices[0].message.content


async def test_constrained_rows_alone_and_in_a_mixed_batch(checkpoints):
    cases = [dict(temperature=0), dict(temperature=1.0, seed=5), dict(temperature=0.7, seed=9, top_p=0.9),
             dict(temperature=0.9, seed=3, extra_body={"repetition_penalty": 1.3, "min_p": 0.05})]
    async with Server(make_engine(checkpoints["qwen3"]), "qwen3") as s:
        alone = [await constrained(s.client, i, **p) for i, p in enumerate(cases)]
    engine = make_engine(checkpoints["qwen3"])
    engine.max_batch = engine.scheduler.max_batch = 6
    async with Server(engine, "qwen3") as s:
        results = await asyncio.gather(*[constrained(s.client, i, **p) for i, p in enumerate(cases)],
                                       *[free(s.client, i) for i in range(3)])
    for (content, logprobs, finish), (content0, logprobs0, finish0) in zip(results[:len(cases)], alone):
        assert (content, finish) == (content0, finish0)
        assert logprobs == pytest.approx(logprobs0, abs=1e-4)
    for content, _, finish in alone:
        if finish == "stop":
            assert set(json.loads(content)) == {"word", "n"}


async def test_identical_constrained_requests_at_once_give_one_answer(checkpoints):
    engine = make_engine(checkpoints["qwen3"])
    engine.max_batch = engine.scheduler.max_batch = 8
    async with Server(engine, "qwen3") as s:
        for params in (dict(temperature=0), dict(temperature=1.0, seed=123)):
            answers = await asyncio.gather(*[constrained(s.client, 0, **params) for _ in range(8)],
                                           *[free(s.client, i) for i in range(4)])
            assert len({json.dumps(a) for a in answers[:8]}) == 1
