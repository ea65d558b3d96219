"""Determinism on the CPU path: a request's tokens and logprobs do not depend on the load
around it, compared bit for bit (the logprobs are the float32 values themselves,
round-tripped exactly through JSON). The prefix cache and chunked prefill are checked
for correctness here; their bit-invariance needs the GPU kernels (bench/backend_determinism.py)."""
from __future__ import annotations

import asyncio
import random

import aiohttp

from conftest import Server, make_engine, metric

PROMPT = [{"role": "user", "content": "A paged cache holds keys and values in blocks of sixteen tokens. " * 3}]


async def answer(client, model, messages, max_tokens=16, **params):
    r = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, logprobs=True,
                                             top_logprobs=2, **params)
    return r.choices[0].message.content, [(e.token, e.logprob) for e in r.choices[0].logprobs.content]


async def noise(client, model, rng):
    words = "the quick brown fox jumps over a lazy dog while caches fill".split()
    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
    await client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                         max_tokens=rng.randint(1, 12), temperature=rng.random(), seed=rng.randint(0, 99))


async def test_same_answer_alone_and_among_queued_requests(qwen3):
    rng = random.Random(0)
    for params in ({"temperature": 0}, {"temperature": 0.8, "seed": 42}):
        alone = await answer(qwen3.client, "qwen3", PROMPT, **params)
        for _ in range(2):
            others = [asyncio.create_task(noise(qwen3.client, "qwen3", rng)) for _ in range(rng.randint(2, 5))]
            target = asyncio.create_task(answer(qwen3.client, "qwen3", PROMPT, **params))
            others += [asyncio.create_task(noise(qwen3.client, "qwen3", rng)) for _ in range(rng.randint(0, 3))]
            assert await target == alone
            await asyncio.gather(*others)


def same_tokens_close_logprobs(x, y):
    """For paths whose reductions legitimately differ on the CPU (the torch references are
    not batch-invariant): same text and tokens, logprobs equal to float32 rounding."""
    assert x[0] == y[0]
    assert [t for t, _ in x[1]] == [t for t, _ in y[1]]
    assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(x[1], y[1]))


async def test_cpu_path_leaves_the_prefix_cache_off(qwen3):
    await answer(qwen3.client, "qwen3", PROMPT, temperature=0)
    await answer(qwen3.client, "qwen3", PROMPT, temperature=0)
    assert await metric(qwen3.url, "detgate_backend_prefix_cache_queries_total") == 0


async def test_prefix_cache_serves_the_right_blocks(checkpoints):
    async with Server(make_engine(checkpoints["llama"], prefix_caching=True), "llama") as s:
        first = await answer(s.client, "llama", PROMPT, temperature=0.8, seed=5)
        again = await answer(s.client, "llama", PROMPT, temperature=0.8, seed=5)
        assert await metric(s.url, "detgate_backend_prefix_cache_hits_total") >= 3
    same_tokens_close_logprobs(again, first)


async def test_chunked_prefill_computes_the_same_answer(checkpoints):
    answers = []
    for chunk in (16, 32, 512):
        engine = make_engine(checkpoints["qwen2"], chunk_size=chunk, max_batched_tokens=512)
        async with Server(engine, "qwen2") as s:
            answers.append(await answer(s.client, "qwen2", PROMPT, temperature=0.8, seed=9))
    same_tokens_close_logprobs(answers[0], answers[2])
    same_tokens_close_logprobs(answers[1], answers[2])


async def test_audit_reruns_served_requests_and_counts_matches(checkpoints):
    engine = make_engine(checkpoints["qwen3"], audit_rate=1.0)
    async with Server(engine, "qwen3") as s:
        await answer(s.client, "qwen3", PROMPT, temperature=0.8, seed=1)
        await s.client.chat.completions.create(model="qwen3", messages=PROMPT, max_tokens=30, stop=["e"])
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                async with http.get(s.url + "/metrics") as r:
                    metrics = await r.text()
                if 'detgate_backend_audit_total{result="match"} 2.0' in metrics:
                    break
                await asyncio.sleep(0.05)
    assert 'detgate_backend_audit_total{result="match"} 2.0' in metrics
    assert 'result="mismatch"' not in metrics


async def test_preempted_sequences_are_recomputed_to_the_same_answer(checkpoints):
    prompts = [[{"role": "user", "content": f"{i} the quick brown fox jumps over the lazy dog " * 3}] for i in range(4)]
    params = dict(temperature=0.8, seed=21, max_tokens=48, extra_body={"ignore_eos": True})
    async with Server(make_engine(checkpoints["qwen3"]), "qwen3") as s:
        alone = [await answer(s.client, "qwen3", p, **params) for p in prompts]
    # Batching on the CPU only to run out of KV blocks: 4 sequences of ~140 tokens in 12 blocks of 16.
    engine = make_engine(checkpoints["qwen3"], kv_blocks=12)
    engine.max_batch = engine.scheduler.max_batch = 4
    async with Server(engine, "qwen3") as s:
        crowded = await asyncio.gather(*(answer(s.client, "qwen3", p, **params) for p in prompts))
    assert engine.scheduler.preemptions > 0
    for x, y in zip(crowded, alone):
        same_tokens_close_logprobs(x, y)
