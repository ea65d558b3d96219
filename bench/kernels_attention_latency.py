"""Where small-batch decode time goes, bits unchanged: pipeline stages, path, splits per
program, warps, the launch floor, and the GPU time of each kernel of a call (input sets
rotated past the L2).

    python3 bench/kernels_attention_latency.py [--out bench/results]

Every variant's output is compared with the shipped config's (`eq`): a faster variant
that kept the bits could ship without a KERNEL_VERSION bump. Writes
kernels_attention_latency.json and prints one line per shape.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench.kernels_attention as ka  # noqa: E402
from kernels import attention_triton as at  # noqa: E402


# (name, (BLOCK_M, warps), decode pipeline stages, split path (None: the wrapper's pick), splits per
# program); `eq` compares with the first.
VARIANTS = [("s2", None, 2, None, None), ("s3", None, 3, None, None), ("s4", None, 4, None, None),
            ("fold", None, 2, False, None), ("fold s3", None, 3, False, None),
            ("split s3 (1,1)", None, 3, True, (1, 1)), ("split s3 (4,1)", None, 3, True, (4, 1)),
            ("64x8 s2", (64, 8), 2, None, None)]


@triton.jit
def _empty(x_ptr):
    tl.store(x_ptr + tl.program_id(0), 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    out = Path(ap.parse_args().out)
    x = torch.zeros(1024, device="cuda")
    print(f"empty kernel in graph: {ka.bench_graph(lambda: _empty[(8,)](x)):.2f} us", flush=True)
    print(f"two empty kernels in graph: {ka.bench_graph(lambda: (_empty[(8,)](x), _empty[(8,)](x))):.2f} us", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, shipped_stages = [], at.DECODE_STAGES
    for B, ctx in [(1, 512), (1, 2048), (1, 8192), (1, 32768), (2, 2048), (4, 2048), (8, 512), (8, 2048), (8, 8192),
                   (16, 512), (16, 2048), (32, 512), (64, 512), (256, 512)]:
        sets = ka.decode_sets(B, ctx, gen)  # rotated past the L2, as in bench/kernels_attention.py
        row = {"B": B, "ctx": ctx}
        base = None
        for name, cfg, stages, path, share in VARIANTS:
            at.DECODE_STAGES = stages
            calls = [ka.decode_call(s, ctx, config=cfg, split_per_program=path, splits_per_program=share) for s in sets]
            try:
                o = calls[0]()
                base = o if base is None else base
                row[name] = round(ka.bench_rotated(calls), 2)
                row[name + " eq"] = bool(torch.equal(o, base))
            except Exception as e:
                row[name] = f"fail {type(e).__name__}: {str(e)[:80]}"
        at.DECODE_STAGES = shipped_stages
        if B == 1 and ctx in (512, 2048) or B == 16:
            from torch.profiler import profile, ProfilerActivity
            calls = [ka.decode_call(s, ctx, split_per_program=None) for s in sets]  # the shipped launch
            for _ in range(3):
                calls[0]()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for c in calls[:20]:
                    c()
                torch.cuda.synchronize()
            row["kernel_us"] = {e.key[:40]: round(e.device_time, 2) for e in prof.key_averages() if e.device_time > 0}
        print(row, flush=True)
        rows.append(row)
        sets = calls = None
    (out / "kernels_attention_latency.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
