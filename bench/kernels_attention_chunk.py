"""Chunk size beyond the one-tile band: CHUNK_TILES 4 (shipped) against 8, same process.

    python3 bench/kernels_attention_chunk.py [--out bench/results]

Each CHUNK_TILES is its own kernel version (other bits), so this only times them: decode
at the long-context shapes the choice moves (alternating, best of two turns, with cuDNN
for scale) and two long prefills. Writes kernels_attention_chunk.json.
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

CHUNKS = (4, 8)


def timed(call) -> dict:
    """Best of two alternating turns per chunk size, microseconds; the module's size is restored."""
    shipped, best = at.CHUNK_TILES, {}
    try:
        for chunk in CHUNKS * 2:
            at.CHUNK_TILES = chunk
            best[f"chunk{chunk}_us"] = min(best.get(f"chunk{chunk}_us", float("inf")), ka.bench_graph(call))
    finally:
        at.CHUNK_TILES = shipped
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    out = Path(ap.parse_args().out)
    gen = torch.Generator(device=ka.DEV).manual_seed(0)
    rows = []
    for B, ctx in [(1, 8192), (1, 32768), (2, 8192), (8, 2048), (8, 8192), (8, 32768)]:
        k_cache, v_cache, tables, k, v = ka.paged_copy(B, ctx, gen)
        q, cu, kv_lens = ka.decode_batch(B, ctx, gen)
        row = {"op": "decode", "batch": B, "len": ctx, **timed(lambda: at.paged_attention_triton(
            q, k_cache, v_cache, tables, cu, kv_lens, ka.D ** -0.5, max_q_len=1, max_kv_len=ctx))}
        row["cudnn_us"] = ka.sdpa_time(q[:, :, None], k, v, False, SDPBackend.CUDNN_ATTENTION)
        rows.append(row)
        print(row, flush=True)
        k_cache = v_cache = k = v = None
    for B, L in [(1, 8192), (1, 16384)]:
        k_cache, v_cache, tables, _, _ = ka.paged_copy(B, L, gen)
        q, cu, kv_lens = ka.prefill_batch(B, L, gen)
        q = q.flatten(0, 1)
        row = {"op": "prefill", "batch": B, "len": L, **timed(lambda: at.paged_attention_triton(
            q, k_cache, v_cache, tables, cu, kv_lens, ka.D ** -0.5, max_q_len=L, max_kv_len=L))}
        rows.append(row)
        print(row, flush=True)
        k_cache = v_cache = None
    (out / "kernels_attention_chunk.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
