"""Decode attention at many sequences and short contexts, where a serving step spends most of
its GPU time (0.6B shape, 256 requests: 2.4 of 4.6 ms, bench/results/backend_profile_*_b256_*):
pipeline stages and a register cap, which decide how many programs share an SM. Neither changes
a sum, so every variant's output is compared with the shipped launch's (`eq`).

    python3 bench/kernels_attention_occupancy.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench.kernels_attention as ka  # noqa: E402
from bench.md_table import markdown_table  # noqa: E402
from kernels import attention_triton as at  # noqa: E402

# (decode pipeline stages, register cap per thread or None); the first is the shipped launch.
VARIANTS = [(3, None), (2, None), (3, 168), (2, 168), (2, 128), (3, 128)]
HEADS = {"0.6B (16/8)": 16, "8B (32/8)": 32}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    out = Path(ap.parse_args().out)
    gbps = ka.ceilings()["copy_GBps"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, heads in HEADS.items():
        ka.H = heads
        for B in (32, 256):
            for ctx in (128, 256, 1024):
                sets = ka.decode_sets(B, ctx, gen)
                floor = ka.kv_bytes(B, ctx) / gbps / 1e3
                row, base = {"heads": label, "batch": B, "context": ctx, "floor us": round(floor, 1)}, None
                for stages, regs in VARIANTS:
                    at.DECODE_STAGES, at.DECODE_MAXNREG = stages, regs
                    calls = [ka.decode_call(s, ctx, split_per_program=None) for s in sets]
                    o = calls[0]()
                    base = o if base is None else base
                    name = f"s{stages}" + (f" r{regs}" if regs else "")
                    row[name] = round(ka.bench_rotated(calls), 2)
                    row[name + " eq"] = bool(torch.equal(o, base))
                print(row, flush=True)
                rows.append(row)
                sets = calls = None
    at.DECODE_STAGES, at.DECODE_MAXNREG = VARIANTS[0]
    gpu = torch.cuda.get_device_name()
    (out / "kernels_attention_occupancy.json").write_text(json.dumps({"gpu": gpu, "copy_GBps": gbps, "rows": rows},
                                                                      indent=1))
    text = (f"`python3 bench/kernels_attention_occupancy.py` ({gpu}); us per call, CUDA graphs, input sets "
            f"rotated past the L2; floor = KV bytes / {gbps:.0f} GB/s; sN = N decode stages, rM = M registers a "
            f"thread at most; eq = same bits as s3\n\n{markdown_table(rows)}\n")
    (out / "kernels_attention_occupancy.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
