"""Batches of 9..128 rows against the dispatch before: at 17..128 a program per (tile, K segment)
where one program of a 64x32 pointer tile summed every K segment, at 9..16 the 16x32 decode tile.

At 17..128 rows (32 requests decoding, a prefill chunk of 64 or 128 tokens) the tiles alone leave
most SMs idle where N is small: the 0.6B o projection at 32 rows made 32 programs of 32 columns,
each walking all of K. The shipped dispatch (kernels.matmul._batch_split) gives each K segment its
own program, on the widest 64-row tile that still gives the GPU enough of them. Both sum each
segment from zero and add the segments first to last, so the bits are the same; this checks that
too. Only the matmuls are timed: where the shipped dispatch hands on Partials, the norms and RoPE
that add them do work left out here (bench/backend_ab.py's end-to-end runs include it). At 9..16
rows the 16x32 decode tile, with 2 warps and 8 stages, gives twice the programs of the 16x64 one.
Each variant is a CUDA graph of a model's layers' four matmuls at M rows (qkv, o and down as the
engine calls them, matmul_partials; gate_up and SiLU·up as swiglu), every layer its own weights,
so that they stream from memory as in a step.

    python3 bench/kernels_batch_split.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels.device import DECODE_ROWS  # noqa: E402
from kernels_dense import gpu_us  # noqa: E402
from md_table import markdown_table  # noqa: E402

matmul_module = importlib.import_module("kernels.matmul")   # not the function `kernels` exports
SHIPPED = matmul_module._config
# hidden, q + k + v columns, o's K, intermediate, layers (the 8B's four: 1.7 GB, past the L2)
SHAPES = {"qwen3-0.6b": (1024, 4096, 2048, 3072, 28), "llama3-8b": (4096, 6144, 4096, 14336, 4)}
# 256: where the shipped dispatch is the one before, a check that nothing moved (at 8 rows the 0.6B
# qkv, o and down projections run the decode_small tile since)
ROWS = (8, 16, 17, 32, 64, 128, 256)


def dispatch_before(m, n, k, dtype, device, segments, gated=False):
    """The dispatch before: the 16x64 decode tile up to 16 rows, and where the shipped one now splits a
    batch, 64x32 pointer tiles, each program summing every segment."""
    config = SHIPPED(m, n, k, dtype, device, segments, gated)
    if m <= DECODE_ROWS:
        return matmul_module.CONFIGS["decode"]
    return config if config[4] != "split" else (64, 32, 4, 8, "pointer")


def layers(shape: str) -> tuple[list[dict], int, int]:
    hidden, qkv, o_k, inter, count = SHAPES[shape]
    def w(n, k):
        return (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5).t()
    return [dict(qkv=w(qkv, hidden), o=w(hidden, o_k), gate_up=w(2 * inter, hidden), down=w(hidden, inter))
            for _ in range(count)], hidden, o_k


def step(weights: list[dict], x: torch.Tensor, attn: torch.Tensor) -> list:
    outs = []
    for w in weights:
        up = kernels.swiglu(x, w["gate_up"])
        outs += [kernels.matmul_partials(x, w["qkv"]), kernels.matmul_partials(attn, w["o"]), up,
                 kernels.matmul_partials(up, w["down"])]
    return outs


def products(outs: list) -> list[torch.Tensor]:
    return [t.product() if isinstance(t, matmul_module.Partials) else t for t in outs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for shape in SHAPES:
        weights, hidden, o_k = layers(shape)
        for m in ROWS:
            x = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
            attn = torch.randn(m, o_k, device="cuda", dtype=torch.bfloat16)
            us, outs = {}, {}
            for name, dispatch in (("before", dispatch_before), ("shipped", SHIPPED)):
                matmul_module._config = dispatch
                try:
                    outs[name] = products(step(weights, x, attn))
                    # gpu_us runs the step once outside its graph: that sizes the split workspaces.
                    us[name] = gpu_us(lambda: step(weights, x, attn)) / len(weights)
                finally:
                    matmul_module._config = SHIPPED
            segments = matmul_module.k_segments
            tiles = sorted({SHIPPED(m, n, k, torch.bfloat16, x.device, segments(k, n, torch.bfloat16)[0])[:2]
                            for n, k in ((w.shape[1], w.shape[0]) for w in weights[0].values())})
            rows.append({"shape": shape, "rows": m, "shipped tiles (M x N)": " ".join(f"{a}x{b}" for a, b in tiles),
                         "before us a layer": round(us["before"], 2), "shipped us a layer": round(us["shipped"], 2),
                         "shipped / before": round(us["shipped"] / us["before"], 3),
                         "same bits": all(torch.equal(a, b) for a, b in zip(outs["before"], outs["shipped"]))})
            print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    (out / "kernels_batch_split.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    md = (f"`python3 bench/kernels_batch_split.py` ({gpu}; GPU us a layer of a model's four matmuls, "
          f"from CUDA-graph replays of all its layers)\n\n{markdown_table(rows)}\n")
    (out / "kernels_batch_split.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
