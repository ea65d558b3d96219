"""Paged attention for every GQA group: groups that do not divide the kernel's 64/128-row tile
(3, 5, 7: SmolLM2, Llama-3.2-3B, Qwen2.5-7B, Qwen3-14B) beside the power-of-two ones, head_dim
64 and 128, on the GPU.

    python3 bench/kernels_attention_gqa.py [--baseline OLD_attention_triton.py] [--out bench/results]

1. Per (group, head_dim), in worker processes (they also fill Triton's cache for step 2):
   bit-invariance of one target sequence's rows over random scenarios (chunkings, cached
   prefix, decode, batches of up to 63 others, split vs fold path; bench/kernels_attention.py's
   harness), error against fp64; and with --baseline, for the power-of-two groups, whether
   every row equals the previous kernel's, bit for bit, on the fold and split paths.
2. Speed, one process: decode (batch 1/16/64, context 512/4096, KV rotated past the L2) as a
   fraction of the copy-bandwidth floor, and prefill of 2048 tokens against SDPA flash; the
   previous kernel beside it for the power-of-two groups.
Writes kernels_attention_gqa.{md,json} under --out and prints the tables.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import multiprocessing
import os
import random
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench.kernels_attention as ka  # noqa: E402
from kernels import attention_triton  # noqa: E402
from md_table import markdown_table  # noqa: E402  (this script's folder is on sys.path)

# (group, head_dim, KV heads): Llama/Qwen-like 8 KV heads at 128, SmolLM2-like 3 at 64.
CASES = [(g, 128, 8) for g in (1, 2, 3, 4, 5, 7, 8)] + [(g, 64, 3) for g in (1, 3, 4, 5, 7)]
DECODE = [(1, 512), (16, 512), (1, 4096), (64, 4096)]
PREFILL_LEN = 2048


def use(group: int, head_dim: int, kv_heads: int, kernel=attention_triton) -> None:
    """Point bench/kernels_attention.py's harness at this head layout and kernel module."""
    ka.H, ka.H_KV, ka.D, ka.at = group * kv_heads, kv_heads, head_dim, kernel
    ka.MAX_OTHER = 2048


def load_baseline(path: str | None):
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("attention_triton_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(case, baseline_path) -> dict:
    group, head_dim, kv_heads = case
    use(*case)
    # Group 3 at 128 also runs past position 8192, where splits widen.
    length = 9000 if (group, head_dim) == (3, 128) else 3000
    out = {"group": group, "head_dim": head_dim, "kv_heads": kv_heads,
           **{k: v for k, v in ka.invariance(5, L=length, seed=group * 1000 + head_dim).items() if k != "scenario_log"}}
    baseline = load_baseline(baseline_path)
    if baseline is not None and group & (group - 1) == 0:
        gen = torch.Generator(device=ka.DEV).manual_seed(7)
        seq = tuple(torch.randn(3000, h, head_dim, device=ka.DEV, generator=gen).to(ka.DTYPE)
                    for h in (ka.H, ka.H_KV, ka.H_KV))
        equal = total = 0
        for path in ("fold", "split"):
            for chunks in ([3000], [1200, 1000, 792] + [1] * 8):
                rows = {}
                for name, kernel in (("new", attention_triton), ("old", baseline)):
                    use(*case, kernel=kernel)
                    rows[name] = ka.run_scenario(seq, chunks, 0, 7, random.Random(3), torch.Generator(
                        device=ka.DEV).manual_seed(3), path)
                same = rows["new"].view(torch.int16) == rows["old"].view(torch.int16)
                equal += int(same.all(-1).all(-1).sum())
                total += rows["new"].shape[0]
        out["rows_equal_to_previous_kernel"] = f"{equal}/{total}"
    return out


def timings(case, bw, baseline) -> dict:
    group, head_dim, kv_heads = case
    gen = torch.Generator(device=ka.DEV).manual_seed(0)
    row = {"group": group, "head_dim": head_dim, "kv_heads": kv_heads}
    kernels = [("new", attention_triton)] + ([("old", baseline)] if baseline and group & (group - 1) == 0 else [])
    for B, ctx in DECODE:
        use(*case)
        sets = ka.decode_sets(B, ctx, gen)
        floor_us = (ka.kv_bytes(B, ctx) + 2 * B * ka.H * head_dim * 2) / bw / 1e3
        for name, kernel in kernels:
            use(*case, kernel=kernel)
            us = ka.bench_rotated([ka.decode_call(s, ctx, split_per_program=None) for s in sets])
            row[f"decode b{B}/{ctx} {name} us"] = round(us, 2)
            row[f"decode b{B}/{ctx} {name} of floor"] = round(floor_us / us, 3)
        sets = None
    use(*case)
    k_cache, v_cache, tables, k, v = ka.paged_copy(1, PREFILL_LEN, gen)
    q, cu, kv_lens = ka.prefill_batch(1, PREFILL_LEN, gen)
    for name, kernel in kernels:
        row[f"prefill {PREFILL_LEN} {name} us"] = round(ka.bench_graph(lambda: kernel.paged_attention_triton(
            q.flatten(0, 1), k_cache, v_cache, tables, cu, kv_lens, head_dim ** -0.5, max_q_len=PREFILL_LEN,
            max_kv_len=PREFILL_LEN)), 2)
    flash = ka.sdpa_time([(q.transpose(1, 2), k, v)], True, ka.SDPBackend.FLASH_ATTENTION)
    row[f"prefill {PREFILL_LEN} flash us"] = round(flash, 2) if flash else None
    row["prefill speed vs flash"] = round(flash / row[f"prefill {PREFILL_LEN} new us"], 3) if flash else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="the previous kernels/attention_triton.py, for bit equality and speed")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--cases", help="only these group/head_dim cases, e.g. 3/128,4/64 (default: all)")
    parser.add_argument("--no-checks", action="store_true", help="speed only")
    parser.add_argument("--hashes", metavar="FILE", help="also run bench/cross_gpu_hashes.py --out FILE beside the "
                        "checks (it ends before any timing starts)")
    args = parser.parse_args()
    cases = CASES
    if args.cases:
        wanted = {tuple(map(int, c.split("/"))) for c in args.cases.split(",")}
        cases = [c for c in CASES if c[:2] in wanted]
    hashes = None
    if args.hashes:
        root = Path(__file__).resolve().parents[1]
        hashes = subprocess.Popen([sys.executable, str(root / "bench" / "cross_gpu_hashes.py"), "--out", args.hashes],
                                  env={**os.environ, "PYTHONPATH": str(root)})
    checks = []
    if not args.no_checks:
        with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            checks = list(pool.map(check, cases, [args.baseline] * len(cases)))
    if hashes is not None and hashes.wait():
        print(f"cross_gpu_hashes.py failed with exit code {hashes.returncode}", flush=True)
    print(markdown_table(checks), flush=True)
    ceil = ka.ceilings()
    baseline = load_baseline(args.baseline)
    speed = [timings(case, ceil["copy_GBps"], baseline) for case in cases]
    print(markdown_table(speed), flush=True)
    result = {"device": torch.cuda.get_device_name(), "ceilings": ceil,
              "toolchain": __import__("kernels").toolchain(torch.device("cuda")), "invariance": checks, "speed": speed}
    out = Path(args.out)
    (out / "kernels_attention_gqa.json").write_text(json.dumps(result, indent=1))
    (out / "kernels_attention_gqa.md").write_text(
        f"# Paged attention for every GQA group ({result['device']}, {result['toolchain']})\n\n"
        f"`python3 bench/kernels_attention_gqa.py --baseline <previous attention_triton.py>`; copy "
        f"{ceil['copy_GBps']:.0f} GB/s.\n\n## Invariance and accuracy\n\n{markdown_table(checks)}\n\n"
        f"## Speed (median us; decode as a fraction of the copy-bandwidth floor)\n\n{markdown_table(speed)}\n")


if __name__ == "__main__":
    main()
