"""Determinism harness for the whitebox backend: count unique outputs of one request.

Against a running backend (see backend_gpu.py, which starts one per mode):
  * load: the same prompt sent N times (greedy; temperature 0.8 with seed 42; the same
    with top-k 50 and top-p 0.9) in waves of random size while random other requests of
    random lengths keep arriving, so the batch around it is different every time;
  * cache: a fresh prompt cold, then again with its prefix cached, then cached under load;
  * multi-turn: a three-turn conversation replayed from scratch under load, and its last
    turn sent alone.
An output is the text together with every token's logprob (float32 bits, exact through
JSON), so "1 unique" means bit-identical logits along the whole answer.

    python bench/backend_determinism.py --url http://127.0.0.1:8000 --vocab 151936 -n 1000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import aiohttp

KINDS = {"greedy": {"temperature": 0}, "t0.8 seed42": {"temperature": 0.8, "seed": 42},
         "t0.8 top-k50 top-p0.9 seed42": {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 42}}


class Client:
    def __init__(self, url: str, vocab: int):
        self.url, self.vocab = url, vocab
        # Ordinary word tokens only: the last ids of bench checkpoints are special tokens.
        self.word_ids = vocab - 8

    async def __aenter__(self):
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                          timeout=aiohttp.ClientTimeout(total=600))
        return self

    async def __aexit__(self, *exc):
        await self.http.close()

    async def post(self, path: str, body: dict) -> dict:
        async with self.http.post(self.url + path, json={"model": "bench", **body}) as r:
            data = await r.json()
            if r.status != 200:
                raise RuntimeError(f"{path} -> {r.status}: {data}")
            return data

    def prompt(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(self.word_ids) for _ in range(n)]

    async def complete(self, prompt: list[int], max_tokens: int, logprobs: bool = True, **params) -> tuple:
        body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **params}
        if logprobs:
            body["logprobs"] = 1
        choice = (await self.post("/v1/completions", body))["choices"][0]
        return choice["text"], tuple(choice["logprobs"]["token_logprobs"]) if logprobs else ()

    async def chat(self, messages: list[dict], max_tokens: int, **params) -> str:
        data = await self.post("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens,
                                                        "ignore_eos": True, **params})
        return data["choices"][0]["message"]["content"]


class Load:
    """Keeps `concurrency` random requests in flight until stopped."""

    def __init__(self, client: Client, concurrency: int, seed: int):
        self.client, self.concurrency, self.rng = client, concurrency, random.Random(seed)
        self.sent = 0
        self.stopping = False

    async def _worker(self):
        rng = random.Random(self.rng.random())
        while not self.stopping:
            await asyncio.sleep(rng.random() * 0.02)
            await self.client.complete(self.client.prompt(rng, rng.randint(1, 600)), rng.randint(1, 96),
                                       temperature=rng.choice([0, 0.7, 1.0]), top_p=rng.choice([1.0, 0.9]),
                                       seed=rng.randrange(1 << 31))
            self.sent += 1

    async def __aenter__(self):
        self.tasks = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        return self

    async def __aexit__(self, *exc):
        self.stopping = True
        await asyncio.gather(*self.tasks)


async def under_load(client: Client, n: int, budget_s: float, concurrency: int) -> dict:
    rng = random.Random(7)
    prompt = client.prompt(rng, 180)
    outputs = {kind: [] for kind in KINDS}
    start = time.monotonic()
    async with Load(client, concurrency, seed=1) as load:
        while min(len(v) for v in outputs.values()) < n and time.monotonic() - start < budget_s:
            wave = [rng.choice(list(KINDS)) for _ in range(rng.randint(1, 64))]

            async def one(kind):
                await asyncio.sleep(rng.random() * 0.05)
                outputs[kind].append(await client.complete(prompt, 48, **KINDS[kind]))

            await asyncio.gather(*(one(kind) for kind in wave))
    return {kind: {"n": len(v), "unique": len(set(v))} for kind, v in outputs.items()} | {
        "background_requests": load.sent, "seconds": round(time.monotonic() - start, 1)}


async def cold_vs_cached(client: Client, concurrency: int) -> dict:
    rng = random.Random(11)
    out = {}
    for kind, params in KINDS.items():
        prompt = client.prompt(rng, 300)   # new: nothing of it is cached yet
        cold = await client.complete(prompt, 32, **params)
        cached = await client.complete(prompt, 32, **params)
        async with Load(client, concurrency, seed=2):
            loaded = await asyncio.gather(*(client.complete(prompt, 32, **params) for _ in range(8)))
        out[kind] = {"n": 10, "unique": len({cold, cached, *loaded}), "cold_equals_cached": cold == cached}
    return out


async def multi_turn(client: Client, replays: int, concurrency: int) -> dict:
    rng = random.Random(13)
    users = [" ".join(f"t{rng.randrange(client.word_ids)}" for _ in range(rng.randint(20, 80))) for _ in range(3)]
    out = {}
    for kind, params in KINDS.items():
        async def conversation():
            messages, answers = [], []
            for user in users:
                messages.append({"role": "user", "content": user})
                answers.append(await client.chat(messages, 24, **params))
                messages.append({"role": "assistant", "content": answers[-1]})
            return tuple(answers), messages

        first, messages = await conversation()
        async with Load(client, concurrency, seed=3):
            replayed = await asyncio.gather(*(conversation() for _ in range(replays)))
        last_alone = await client.chat(messages[:-1], 24, **params)
        runs = [first] + [answers for answers, _ in replayed]
        out[kind] = {"n": len(runs), "unique": len(set(runs)), "last_turn_alone_equal": last_alone == first[-1]}
    return out


async def run_all(url: str, vocab: int, n: int, budget_s: float, concurrency: int, replays: int) -> dict:
    async with Client(url, vocab) as client:
        return {"load": await under_load(client, n, budget_s, concurrency),
                "cache": await cold_vs_cached(client, concurrency),
                "multi_turn": await multi_turn(client, replays, concurrency)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--vocab", type=int, required=True, help="the model's vocabulary size")
    p.add_argument("-n", type=int, default=1000, help="copies of the target request per kind")
    p.add_argument("--budget-s", type=float, default=120, help="stop sending targets after this long")
    p.add_argument("--concurrency", type=int, default=32, help="background requests in flight")
    p.add_argument("--replays", type=int, default=8)
    args = p.parse_args()
    print(json.dumps(asyncio.run(run_all(args.url, args.vocab, args.n, args.budget_s, args.concurrency,
                                         args.replays)), indent=2))


if __name__ == "__main__":
    main()
