"""Decode attention at many sequences, old kernels against new in one process: the shipped
module of an old tree (unpacked beforehand, as bench/backend_ab.py's --old-tree) and this
tree's, on the same inputs (CUDA graphs, input sets rotated past the L2), with every output
compared bit for bit. Floor: the KV bytes over the copy bandwidth.

    git archive REV --prefix=.old/ | tar -x
    python3 bench/kernels_attention_ab.py --old-tree .old --out bench/results/kernels_attention_NAME_ab
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench.kernels_attention as ka  # noqa: E402
from bench.md_table import markdown_table  # noqa: E402
from kernels import attention_triton as new  # noqa: E402

HEADS = {"0.6B (16/8)": 16, "8B (32/8)": 32}
BATCHES = (16, 32, 64, 256)
CONTEXTS = (128, 256, 512, 2048)


def load_old(tree: Path):
    """The old tree's kernels/attention_triton.py as a module of its own (its imports resolve here)."""
    spec = importlib.util.spec_from_file_location("old_attention_triton", tree / "kernels" / "attention_triton.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(module, s, ctx):
    k_cache, v_cache, tables, _, _, q, cu, kv_lens = s
    return lambda: module.paged_attention_triton(q, k_cache, v_cache, tables, cu, kv_lens, ka.D ** -0.5, max_q_len=1,
                                                 max_kv_len=ctx)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-tree", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="path of the results without suffix: OUT.md, OUT.json")
    args = ap.parse_args()
    old = load_old(args.old_tree)
    gbps = ka.ceilings()["copy_GBps"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, heads in HEADS.items():
        ka.H = heads
        for B in BATCHES:
            for ctx in CONTEXTS:
                sets = ka.decode_sets(B, ctx, gen)
                olds, news = ([call(m, s, ctx) for s in sets] for m in (old, new))
                same = all(torch.equal(a(), b()) for a, b in zip(olds, news))
                # old, new, new, old: drift over the pair falls on both sides
                t = [ka.bench_rotated(c) for c in (olds, news, news, olds)]
                o, n = (t[0] + t[3]) / 2, (t[1] + t[2]) / 2
                floor = ka.kv_bytes(B, ctx) / gbps / 1e3
                rows.append({"heads": label, "batch": B, "context": ctx, "floor us": round(floor, 1),
                             "old us": round(o, 2), "new us": round(n, 2), "new / old": round(n / o, 3),
                             "new of floor": round(floor / n, 3), "same bits": same})
                print(rows[-1], flush=True)
                sets = olds = news = None
    gpu = torch.cuda.get_device_name()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"gpu": gpu, "old_tree": str(args.old_tree), "copy_GBps": gbps, "rows": rows}, indent=1))
    text = (f"`python3 bench/kernels_attention_ab.py --old-tree {args.old_tree} --out {args.out}` ({gpu}); decode, "
            f"us per call (mean of old, new, new, old), floor = KV bytes / {gbps:.0f} GB/s\n\n{markdown_table(rows)}\n")
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
