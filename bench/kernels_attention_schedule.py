"""Split schedules past the one-tile band, timed against each other in one process.

    python3 bench/kernels_attention_schedule.py [--out bench/results]

A schedule is (WIDE_FROM, WIDE_TILES): CHUNK_TILES-tile splits from the band's end up
to tile WIDE_FROM, WIDE_TILES-tile splits beyond. Each is its own kernel version (other
bits), so they are only timed here, and each checked for split path == fold path. Decode
at the shapes the schedule moves (input sets rotated past the L2, best of two alternating
turns, for each of two split shares, with cuDNN for scale) and two long prefills. Writes
kernels_attention_schedule.json and prints one line per shape.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench.kernels_attention as ka  # noqa: E402
from kernels import attention_triton as at  # noqa: E402

# WIDE_TILES == CHUNK_TILES is the version-3 schedule: 4-tile splits all the way.
SCHEDULES = {"4 all the way": (128, 4), "8 from 8192": (128, 8), "8 from 4096": (64, 8), "16 from 8192": (128, 16)}
SHARES = (None, (8, 1))


def timed(make_calls) -> dict:
    """Best of two alternating turns per schedule, microseconds; the module's schedule is restored."""
    shipped, best = (at.WIDE_FROM, at.WIDE_TILES), {}
    try:
        for _ in range(2):
            for name, (at.WIDE_FROM, at.WIDE_TILES) in SCHEDULES.items():
                for label, calls in make_calls().items():
                    key = f"{name} {label}".strip()
                    best[key] = min(best.get(key, float("inf")), ka.bench_rotated(calls))
    finally:
        at.WIDE_FROM, at.WIDE_TILES = shipped
    return {k: round(v, 2) for k, v in best.items()}


def split_equals_fold(s, ctx) -> dict:
    shipped, out = (at.WIDE_FROM, at.WIDE_TILES), {}
    try:
        for name, (at.WIDE_FROM, at.WIDE_TILES) in SCHEDULES.items():
            fold = ka.decode_call(s, ctx, split_per_program=False)()
            out[name] = all(torch.equal(fold, ka.decode_call(s, ctx, split_per_program=True, splits_per_program=sh)())
                            for sh in SHARES + ((3, 2),))
    finally:
        at.WIDE_FROM, at.WIDE_TILES = shipped
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    out = Path(ap.parse_args().out)
    gen = torch.Generator(device=ka.DEV).manual_seed(0)
    rows = []
    for B, ctx in [(1, 8192), (1, 32768), (2, 8192), (2, 32768), (4, 8192), (4, 32768), (8, 8192), (8, 32768),
                   (16, 8192), (16, 32768), (32, 8192), (64, 8192)]:
        sets = ka.decode_sets(B, ctx, gen)
        row = {"op": "decode", "batch": B, "len": ctx, "split_equals_fold": split_equals_fold(sets[0], ctx),
               **timed(lambda: {f"share {sh}" if sh else "": [ka.decode_call(s, ctx, splits_per_program=sh)
                                                               for s in sets] for sh in SHARES})}
        row["cudnn_us"] = ka.sdpa_time([(s[5][:, :, None], s[3], s[4]) for s in sets], False,
                                       SDPBackend.CUDNN_ATTENTION)
        rows.append(row)
        print(row, flush=True)
        sets = None
    for B, L in [(1, 8192), (1, 16384)]:
        k_cache, v_cache, tables, _, _ = ka.paged_copy(B, L, gen)
        q, cu, kv_lens = ka.prefill_batch(B, L, gen)
        q = q.flatten(0, 1)
        row = {"op": "prefill", "batch": B, "len": L, **timed(lambda: {"": [lambda: at.paged_attention_triton(
            q, k_cache, v_cache, tables, cu, kv_lens, ka.D ** -0.5, max_q_len=L, max_kv_len=L)]})}
        rows.append(row)
        print(row, flush=True)
        k_cache = v_cache = None
    (out / "kernels_attention_schedule.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
