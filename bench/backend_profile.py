"""Profile the engine's decode steps in-process (no HTTP): host functions and GPU kernels.

Builds the engine on a random-weight checkpoint, prefills `--batch` 128-token prompts, then
runs decode steps under cProfile (the host: which Python calls take the step's CPU time)
and under torch.profiler (the GPU: which kernels take the forward pass's time, graph
replays included), and what share of the GPU time the sampler's kernels take (the ones that
draw a token: not the LM head). Prints the tables; writes backend_profile_*.json to --out.

    python3 bench/backend_profile.py --shape qwen3-0.6b --batch 256 --temperature 0.8 --top-k 50 --top-p 0.9
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend_gpu import make_checkpoint  # noqa: E402
from local_backend.config import EngineConfig  # noqa: E402
from local_backend.engine.llm_engine import Engine  # noqa: E402
from local_backend.engine.sequence import Sequence  # noqa: E402
from local_backend.sampling_params import SamplingParams  # noqa: E402

# The kernels that draw a token (kernels/sampling_triton.py, sampling_candidates.py, sampling_filter.py).
SAMPLER = ("_sample_partial_kernel", "_sample_pick_kernel", "_row_uniform_kernel", "_histogram_kernel",
           "_choose_kernel", "_gather_kernel", "_settle_kernel", "_select_kernel")


def host_profile(engine: Engine, steps: int) -> tuple[float, list]:
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        engine._step()
    prof.disable()
    wall = (time.perf_counter() - start) / steps
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = sorted(((f"{Path(f).name}:{line}({name})", tt / steps * 1e6, ct / steps * 1e6)
                   for (f, line, name), (_, _, tt, ct, _) in stats.stats.items()), key=lambda r: -r[1])
    return wall, [(name, round(tt, 1), round(ct, 1)) for name, tt, ct in rows[:25]]


def gpu_profile(engine: Engine, steps: int) -> list:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine._step()
        torch.cuda.synchronize()
    rows = [(r.key[:70], r.count // steps, round(r.self_device_time_total / steps, 1))
            for r in prof.key_averages() if r.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r[2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--mode", default="invariant")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--workdir", default="/tmp/detgate_bench")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    path, shape = make_checkpoint(Path(args.workdir), args.shape, None)
    engine = Engine(EngineConfig(model=str(path), mode=args.mode, max_batch=args.batch, max_model_len=1024,
                                 kv_blocks=4096))
    rng = random.Random(0)
    for i in range(args.batch):
        prompt = [rng.randrange(shape["vocab_size"] - 8) for _ in range(128)]
        engine.scheduler.add(Sequence(i, prompt, 128, SamplingParams(
            seed=i, max_tokens=10_000, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            ignore_eos=True)))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running + list(
            engine.scheduler.waiting)):
        engine._step()
    for _ in range(10):
        engine._step()
    torch.cuda.synchronize()
    wall, host = host_profile(engine, args.steps)
    kernels = gpu_profile(engine, 10)
    gpu_total = sum(t for _, _, t in kernels)
    sampler = sum(t for name, _, t in kernels if name.startswith(SAMPLER))
    print(f"{args.shape} {args.mode} batch {args.batch} (temperature {args.temperature}, top-k {args.top_k}, "
          f"top-p {args.top_p}): {wall * 1e6:.0f} us per step under cProfile; kernels {gpu_total:.0f} us per step, "
          f"of which the sampler's {sampler:.0f} us ({sampler / gpu_total:.1%})")
    print("\n| host function (per step) | self us | cumulative us |\n|---|---|---|")
    for name, tt, ct in host:
        print(f"| {name} | {tt} | {ct} |")
    print("\n| kernel | launches per step | GPU us per step |\n|---|---|---|")
    for name, count, t in kernels[:30]:
        print(f"| {name} | {count} | {t} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"backend_profile_{args.shape}_b{args.batch}_{args.mode}.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "args": vars(args), "wall_us_under_cprofile": round(wall * 1e6, 1),
         "sampler_us": round(sampler, 1), "kernels_us": round(gpu_total, 1), "host": host, "kernels": kernels},
        indent=1))


if __name__ == "__main__":
    main()
