"""Throughput of the whitebox backend against concurrency, and of transformers' generate.

Backend: c requests at once (random 128-token prompts, 128 generated tokens each, greedy,
EOS ignored), generated tokens / wall time, for c in 1..256. transformers: the same
model directory through AutoModelForCausalLM.generate on the same GPU, batch b of
128-token prompts, max_new_tokens tokens forced (min_new_tokens), tokens / wall time.

    python bench/backend_throughput.py --url http://127.0.0.1:8000 --vocab 151936
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from backend_determinism import Client

CONCURRENCY = (1, 4, 16, 32, 64, 128, 256)


async def greedy_wave(client: Client, rng: random.Random, c: int, prompt_len: int, gen_len: int) -> float:
    """Seconds for c greedy requests at once, random prompt_len-token prompts, gen_len new tokens each."""
    prompts = [client.prompt(rng, prompt_len) for _ in range(c)]
    start = time.perf_counter()
    await asyncio.gather(*(client.complete(p, gen_len, logprobs=False, temperature=0) for p in prompts))
    return time.perf_counter() - start


async def backend_sweep(url: str, vocab: int, levels=CONCURRENCY, prompt_len=128, gen_len=128) -> list[dict]:
    rng = random.Random(5)
    rows = []
    async with Client(url, vocab) as client:
        await client.complete(client.prompt(rng, prompt_len), 8, temperature=0)   # warm-up
        for c in levels:
            seconds = await greedy_wave(client, rng, c, prompt_len, gen_len)
            rows.append({"concurrency": c, "tokens": c * gen_len, "seconds": round(seconds, 3),
                         "tok_per_s": round(c * gen_len / seconds, 1)})
    return rows


def transformers_sweep(model_dir: str, vocab: int, batches=(1, 32), prompt_len=128, gen_len=64) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    g = torch.Generator().manual_seed(5)
    rows = []
    for b in batches:
        ids = torch.randint(0, vocab - 8, (b, prompt_len), generator=g).cuda()
        kwargs = dict(max_new_tokens=gen_len, min_new_tokens=gen_len, do_sample=False,
                      attention_mask=torch.ones_like(ids), pad_token_id=0)
        model.generate(ids[:, :16], max_new_tokens=4, do_sample=False, attention_mask=torch.ones_like(ids[:, :16]),
                       pad_token_id=0)   # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        generated = (out.shape[1] - prompt_len) * b
        rows.append({"batch": b, "tokens": generated, "seconds": round(seconds, 3),
                     "tok_per_s": round(generated / seconds, 1)})
    del model
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--transformers-model", help="also time transformers' generate on this checkpoint")
    args = p.parse_args()
    out = {"backend": asyncio.run(backend_sweep(args.url, args.vocab))}
    if args.transformers_model:
        out["transformers"] = transformers_sweep(args.transformers_model, args.vocab)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
