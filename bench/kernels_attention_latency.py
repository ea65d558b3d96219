"""Where small-batch decode time goes, bits unchanged: tile configs, pipeline stages, the
launch floor, and the GPU time of each kernel of a call.

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
    VARIANTS = [("default", None, at.NUM_STAGES), ("64x8", (64, 8), 2), ("128x8", (128, 8), 2), ("64x4 s3", (64, 4), 3),
                ("64x8 s3", (64, 8), 3), ("64x8 s4", (64, 8), 4), ("128x8 s3", (128, 8), 3)]
    rows, shipped_stages = [], at.NUM_STAGES
    for B, ctx in [(1, 512), (8, 512), (1, 2048), (1, 8192), (16, 512), (32, 512), (256, 512), (8, 8192), (1, 32768)]:
        k_cache, v_cache, tables, k, v = ka.paged_copy(B, ctx, gen)
        q, cu, kv_lens = ka.decode_batch(B, ctx, gen)
        row = {"B": B, "ctx": ctx}
        base = None
        for name, cfg, st in VARIANTS:
            at.NUM_STAGES = st
            f = lambda: at.paged_attention_triton(q, k_cache, v_cache, tables, cu, kv_lens, ka.D ** -0.5, max_q_len=1,
                                                  max_kv_len=ctx, config=cfg)
            try:
                o = f()
                base = o if base is None else base
                row[name] = round(ka.bench_graph(f), 2)
                row[name + " eq"] = bool(torch.equal(o, base))
            except Exception as e:
                row[name] = f"fail {type(e).__name__}: {str(e)[:80]}"
        at.NUM_STAGES = shipped_stages
        if B == 1 and ctx in (512, 2048):
            from torch.profiler import profile, ProfilerActivity
            f = lambda: at.paged_attention_triton(q, k_cache, v_cache, tables, cu, kv_lens, ka.D ** -0.5, max_q_len=1, max_kv_len=ctx)
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    f()
                torch.cuda.synchronize()
            row["kernel_us"] = {e.key[:40]: round(e.device_time, 2) for e in prof.key_averages() if e.device_time > 0}
        print(row, flush=True)
        rows.append(row)
        k_cache = v_cache = k = v = None
    (out / "kernels_attention_latency.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
