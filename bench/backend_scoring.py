"""Scoring equals sampling: the logprob a token was sampled with, against the logprob the
backend gives it when the finished sequence is scored again later, in other batches.

Sampling: `n` completions (random prompts of 16-400 tokens, temperature 0.7-1.0, some with
top-k / top-p, random seeds, 16-96 tokens, logprob of each sampled token) sent in waves
while random background requests keep arriving. Scoring: each prompt + completion sent
back with max_tokens 0, in shuffled order under other background load, once as OpenAI
echo + logprobs and once as vLLM's prompt_logprobs. Counts the completion tokens whose
scored logprob differs from the sampled one in any bit (JSON carries the float32 exactly).

    python bench/backend_scoring.py --url http://127.0.0.1:8000 --vocab 151936 -n 200
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from backend_determinism import Client, Load


async def sample(client: Client, rng: random.Random) -> tuple[list[int], list[int], list[float]]:
    prompt = client.prompt(rng, rng.randint(16, 400))
    params = {"temperature": rng.choice([0.7, 0.8, 1.0]), "seed": rng.randrange(1 << 31),
              **rng.choice([{}, {"top_k": 50}, {"top_p": 0.9}, {"top_k": 20, "top_p": 0.8}])}
    await asyncio.sleep(rng.random() * 0.05)
    data = await client.post("/v1/completions", {"prompt": prompt, "max_tokens": rng.randint(16, 96), "logprobs": 0,
                                                 "ignore_eos": True, "return_tokens_as_token_ids": True, **params})
    lp = data["choices"][0]["logprobs"]
    return prompt, [int(t.removeprefix("token_id:")) for t in lp["tokens"]], lp["token_logprobs"]


async def score(client: Client, prompt: list[int], completion: list[int], rng: random.Random) -> tuple[list, list]:
    """(echo + logprobs, prompt_logprobs) logprobs of the completion's tokens."""
    await asyncio.sleep(rng.random() * 0.05)
    ids = prompt + completion
    echo = await client.post("/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})
    vllm = await client.post("/v1/completions", {"prompt": ids, "max_tokens": 0, "prompt_logprobs": 0})
    entries = vllm["choices"][0]["prompt_logprobs"][len(prompt):]
    return (echo["choices"][0]["logprobs"]["token_logprobs"][len(prompt):],
            [e[str(t)]["logprob"] for e, t in zip(entries, completion)])


async def run(url: str, vocab: int, n: int, concurrency: int) -> dict:
    rng = random.Random(17)
    start = time.monotonic()
    async with Client(url, vocab) as client:
        sampled = []
        async with Load(client, concurrency, seed=4):
            while len(sampled) < n:
                wave = rng.randint(1, 48)
                sampled += await asyncio.gather(*(sample(client, rng) for _ in range(min(wave, n - len(sampled)))))
        order = list(range(len(sampled)))
        rng.shuffle(order)
        scored = [None] * len(sampled)
        async with Load(client, concurrency // 2, seed=5):
            for at in range(0, len(order), 24):
                batch = order[at:at + 24]
                results = await asyncio.gather(*(score(client, *sampled[i][:2], rng) for i in batch))
                for i, r in zip(batch, results):
                    scored[i] = r
    tokens = sum(len(c) for _, c, _ in sampled)
    differ = [sum(a != b for a, b in zip(lps, s[k])) for (_, _, lps), s in zip(sampled, scored) for k in (0, 1)]
    return {"completions": len(sampled), "tokens": tokens, "scorings_per_completion": 2,
            "tokens_differing": sum(differ), "completions_differing": sum(d > 0 for d in differ[::2]),
            "completions_differing_prompt_logprobs": sum(d > 0 for d in differ[1::2]),
            "seconds": round(time.monotonic() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("-n", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=32, help="background requests in flight")
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args.url, args.vocab, args.n, args.concurrency)), indent=2))


if __name__ == "__main__":
    main()
