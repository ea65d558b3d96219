"""Where a running backend's time goes, per scenario, beside what a user sees.

For each concurrency c (random 128-token prompts, 128 generated tokens each, greedy, EOS
ignored): generated tokens/s of non-streaming requests (backend_throughput.py's wave), and
from the engine's own /metrics over that run, per engine step: wall time, GPU time of the
forward pass and of the sampler (logits, sampling), host time inside the step (the rest
of it: scheduling, block tables, staging, launches) and outside it (the engine loop
waiting for the GIL or the inbox); then the same requests streamed, for time to first
token and inter-token latency, p50 / p99. Also the time to first token of one long
prompt (chunked prefill), alone.

    python bench/backend_latency.py --url http://127.0.0.1:8000 --vocab 151936
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from backend_determinism import Client
from backend_server import metrics
from backend_throughput import greedy_wave

LEVELS = (1, 32, 256)


def engine_counters(url: str) -> dict[str, float]:
    values = metrics(url)
    return {"steps": values.get("detgate_backend_batch_size_count", 0.0),
            "step_wall": values.get("detgate_backend_step_duration_seconds_sum", 0.0),
            "gpu_forward": values.get('detgate_backend_step_gpu_seconds_total{phase="forward"}', 0.0),
            "gpu_sampler": values.get('detgate_backend_step_gpu_seconds_total{phase="sampler"}', 0.0),
            "handoff_wait": values.get("detgate_backend_step_handoff_wait_seconds_total", 0.0)}


def breakdown(before: dict, after: dict, wall: float) -> dict:
    """Per engine step, in microseconds."""
    d = {k: after[k] - before[k] for k in before}
    steps = max(d["steps"], 1)
    us = 1e6 / steps
    return {"steps": int(d["steps"]), "wall_us": round(wall * us, 1), "gpu_forward_us": round(d["gpu_forward"] * us, 1),
            "gpu_sampler_us": round(d["gpu_sampler"] * us, 1),
            "host_in_step_us": round((d["step_wall"] - d["gpu_forward"] - d["gpu_sampler"]) * us, 1),
            "handoff_wait_us": round(d["handoff_wait"] * us, 1),
            "host_outside_step_us": round((wall - d["step_wall"]) * us, 1)}


def quantiles(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    xs = sorted(xs)
    return xs[len(xs) // 2], xs[min(len(xs) - 1, int(len(xs) * 0.99))]


async def streamed(client: Client, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
    """(time to first token, gaps between later tokens), seconds."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}
    start = time.perf_counter()
    stamps = []
    async with client.http.post(client.url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
    return stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]


async def level(client: Client, url: str, rng: random.Random, c: int, prompt_len: int, gen_len: int) -> dict:
    before = engine_counters(url)
    wall = await greedy_wave(client, rng, c, prompt_len, gen_len)
    row = {"concurrency": c, "tok_per_s": round(c * gen_len / wall, 1),
           "per_step": breakdown(before, engine_counters(url), wall)}
    prompts = [client.prompt(rng, prompt_len) for _ in range(c)]
    runs = await asyncio.gather(*(streamed(client, p, gen_len) for p in prompts))
    ttft = quantiles([t for t, _ in runs])
    itl = quantiles([g for _, gaps in runs for g in gaps])
    row |= {"ttft_ms": [round(x * 1e3, 2) for x in ttft], "itl_ms": [round(x * 1e3, 3) for x in itl]}
    return row


async def long_prompt_ttft(client: Client, rng: random.Random, prompt_len: int, reps: int = 3) -> dict:
    times = []
    for _ in range(reps):
        ttft, _ = await streamed(client, client.prompt(rng, prompt_len), 1)
        times.append(ttft)
    return {"prompt_tokens": prompt_len, "ttft_ms": round(min(times) * 1e3, 1),
            "all_ms": [round(t * 1e3, 1) for t in times]}


async def run(url: str, vocab: int, levels=LEVELS, prompt_len: int = 128, gen_len: int = 128,
              long_prompt: int = 0) -> dict:
    rng = random.Random(5)
    async with Client(url, vocab) as client:
        await client.complete(client.prompt(rng, prompt_len), 8, temperature=0)   # warm-up
        out = {"levels": [await level(client, url, rng, c, prompt_len, gen_len) for c in levels]}
        if long_prompt:
            out["long_prompt"] = await long_prompt_ttft(client, rng, long_prompt)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--long-prompt", type=int, default=0, help="also time the first token of a prompt this long")
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args.url, args.vocab, long_prompt=args.long_prompt)), indent=2))


if __name__ == "__main__":
    main()
