"""Two savings on a decode step, measured for speed and for bits before either is taken.

1. Decode matmul tiles. At one row, the weight read is the whole cost, and the N tiles
   alone give few programs: N = 1024 gives a 16x32 tile 32 programs on 132 SMs. The
   shipped dispatch gives each K segment (kernels.matmul.k_segments) its own program.
   Candidates: the one-program TMA kernel (the dispatch before split-K), more stages,
   16-wide tiles, the pointer kernel, split programs with other stages and tiles. Each is
   timed at M = 1 on the 0.6B and 8B layer shapes (CUDA-graph replays, weights rotated
   past the L2) and its bits compared with the shipped dispatch on 300 rows. Then other
   segment rules (_SPLIT_PROGRAMS, _MIN_SEGMENT_STEPS; these move bits) under the shipped
   dispatch, for speed only. Last, what the segments cost a prefill: a large batch sums its
   segments inside one program, whose load pipeline drains at each segment's end.
2. Sampling from bf16 logits. The engine upcasts the LM head's bf16 logits to fp32 before
   the sampler (at batch 256 a 120 us copy); the sampler and log_softmax take bf16 too.
   Whether they give the same bits from the bf16 logits as from their fp32 upcast decides
   whether the copy can go without moving a token or a logprob.

    python3 bench/kernels_decode_options.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels.matmul import CONFIGS, _matmul_triton  # noqa: E402
from kernels_dense import gpu_us, rotating  # noqa: E402

SHAPES = {"0.6B qkv": (1024, 4096), "0.6B o": (2048, 1024), "0.6B gate_up": (1024, 6144), "0.6B down": (3072, 1024),
          "0.6B lm_head": (1024, 151936), "8B qkv": (4096, 6144), "8B o": (4096, 4096), "8B gate_up": (4096, 28672),
          "8B down": (14336, 4096)}
# The first two and the last: the dispatch before the shipped 8-warp config (16x64 w4 for split
# shapes; for one segment 16x32 TMA tiles or, where N alone fills the GPU, 64x128).
CANDIDATES = [(16, 64, 4, 4, "split"), (16, 32, 4, 8, "tma"), (16, 32, 4, 8, "pointer"), (16, 64, 4, 2, "split"),
              (16, 64, 4, 6, "split"), (16, 128, 4, 4, "split"), (64, 128, 4, 5, "tma")]
# (_SPLIT_PROGRAMS, _MIN_SEGMENT_STEPS); the first makes one segment everywhere: the dispatch before split-K.
RULES = [(512, 1 << 30), (256, 8), (1024, 8), (512, 4), (1024, 4)]
matmul_module = sys.modules["kernels.matmul"]


def matmuls() -> list[dict]:
    rows = []
    for name, (K, N) in SHAPES.items():
        weights = rotating(lambda: torch.randn(N, K, device="cuda", dtype=torch.bfloat16), N * K * 2)
        probe_a, probe_w = torch.randn(300, K, device="cuda", dtype=torch.bfloat16), weights()
        reference = kernels.matmul(probe_a, probe_w.t())
        a = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        shipped = gpu_us(lambda: kernels.matmul(a, weights().t()), target_ms=1, replays=7)
        row = {"shape": name, "K": K, "N": N, "shipped_us": round(shipped, 2),
               "floor_us": round(N * K * 2 / 3.0e12 * 1e6, 2), "candidates": []}
        for config in CANDIDATES:
            try:
                same = torch.equal(_matmul_triton(probe_a, probe_w.t(), None, config), reference)
                us = gpu_us(lambda: _matmul_triton(a, weights().t(), None, config), target_ms=1, replays=7)
                row["candidates"].append({"config": config, "us": round(us, 2), "same_bits": same})
            except Exception as exc:   # out of shared memory and the like
                row["candidates"].append({"config": config, "error": str(exc)[:120]})
        row["segments"] = matmul_module.k_segments(K, N, torch.bfloat16)
        row["rules"] = [{"rule": rule, "segments": segment_rule(rule, lambda: matmul_module.k_segments(K, N, torch.bfloat16)),
                         "us": round(segment_rule(rule, lambda: gpu_us(lambda: kernels.matmul(a, weights().t()),
                                                                        target_ms=1, replays=7)), 2)}
                        for rule in RULES]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def segment_rule(rule, fn):
    saved = matmul_module._SPLIT_PROGRAMS, matmul_module._MIN_SEGMENT_STEPS
    matmul_module._SPLIT_PROGRAMS, matmul_module._MIN_SEGMENT_STEPS = rule
    try:
        return fn()
    finally:
        matmul_module._SPLIT_PROGRAMS, matmul_module._MIN_SEGMENT_STEPS = saved


def prefill() -> list[dict]:
    rows = []
    for name in ("0.6B o", "0.6B down", "8B qkv", "8B o", "8B down"):
        K, N = SHAPES[name]
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        for m in (512, 4096):
            a = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            rows.append({"shape": name, "M": m, "segments": matmul_module.k_segments(K, N, torch.bfloat16)[0],
                         "us": round(gpu_us(lambda: kernels.matmul(a, w.t()), target_ms=2, replays=7), 1),
                         "no_split_us": round(segment_rule(RULES[0], lambda: gpu_us(lambda: kernels.matmul(a, w.t()),
                                                                                    target_ms=2, replays=7)), 1),
                         "cublas_us": round(gpu_us(lambda: torch.mm(a, w.t()), target_ms=2, replays=7), 1)})
    return rows


def sampler_dtype() -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    b, v = 256, 151936
    logits = (torch.randn(b, v, device="cuda", generator=g) * 3).to(torch.bfloat16)
    seeds = torch.arange(b, device="cuda") * 7919
    steps = torch.arange(b, device="cuda") % 5
    temperature = torch.full((b,), 0.8, device="cuda")
    top_k = torch.tensor([0, 50] * (b // 2), dtype=torch.int32, device="cuda")
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0] * (b // 4), device="cuda")
    out = {}
    for name, fn in (("sample", lambda x: kernels.sample(x, seeds, steps, temperature, top_k, top_p)),
                     ("sample greedy", lambda x: kernels.sample(x, seeds, steps, temperature * 0, top_k, top_p)),
                     ("log_softmax", kernels.log_softmax), ("argmax", kernels.argmax)):
        out[name] = torch.equal(fn(logits), fn(logits.float()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "decode_config": CONFIGS["decode"], "matmuls": matmuls(), "prefill": prefill(),
           "sampler_bf16_equals_fp32": sampler_dtype()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_decode_options.json").write_text(json.dumps(res, indent=1))
    print("| shape | segments | floor us | shipped us | "
          + " | ".join(f"{c[0]}x{c[1]} w{c[2]} s{c[3]} {c[4]}" for c in CANDIDATES) + " |")
    print("|---" * (4 + len(CANDIDATES)) + "|")
    for r in res["matmuls"]:
        cells = [f"{c['us']}{'' if c['same_bits'] else ' (bits differ)'}" if "us" in c else "error"
                 for c in r["candidates"]]
        print(f"| {r['shape']} | {r['segments'][0]} | {r['floor_us']} | {r['shipped_us']} | " + " | ".join(cells) + " |")
    print("\nOther segment rules, shipped dispatch, us (segments):")
    print("| shape | " + " | ".join("no split" if m == RULES[0][1] else f"programs {p}, steps >= {m}"
                                    for p, m in RULES) + " |")
    print("|---" * (1 + len(RULES)) + "|")
    for r in res["matmuls"]:
        print(f"| {r['shape']} | " + " | ".join(f"{x['us']} ({x['segments'][0]})" for x in r["rules"]) + " |")
    print("\nPrefill, us:\n| shape | M | segments | shipped | no split | cuBLAS |\n|---|---|---|---|---|---|")
    for r in res["prefill"]:
        print(f"| {r['shape']} | {r['M']} | {r['segments']} | {r['us']} | {r['no_split_us']} | {r['cublas_us']} |")
    print("sampler from bf16 logits equals from their fp32 upcast:", res["sampler_bf16_equals_fp32"])


if __name__ == "__main__":
    main()
