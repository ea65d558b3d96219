"""SiLU·up in the gate_up matmul's epilogue (kernels.swiglu) against the matmul and SiLU·up's own
kernel, at one decode row on the 0.6B and 8B MLP shapes: each variant is a CUDA graph of one MLP's
launches (weights rotated past the L2), with the down projection or without.

    python3 bench/kernels_swiglu.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels_dense import gpu_us, rotating  # noqa: E402
from md_table import markdown_table  # noqa: E402

SHAPES = {"0.6B": (1024, 3072), "8B": (4096, 14336)}   # hidden, intermediate


def variants(x, weights):
    def mlp(fused: bool, down: bool = True):
        def run():
            gate_up, down_w = weights()
            up = kernels.swiglu(x, gate_up) if fused else kernels.silu_mul(kernels.matmul(x, gate_up))
            return kernels.matmul(up, down_w) if down else up
        return run
    return {
        "gate_up, SiLU·up, down": mlp(False),
        "swiglu, down": mlp(True),
        "gate_up, SiLU·up": mlp(False, down=False),
        "swiglu": mlp(True, down=False),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    rows = []
    for name, (h, inter) in SHAPES.items():
        def make():
            return (torch.randn(2 * inter, h, device="cuda", dtype=torch.bfloat16).t(),
                    torch.randn(h, inter, device="cuda", dtype=torch.bfloat16).t())
        weights = rotating(make, 3 * h * inter * 2)
        x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
        gate_up, down = weights()
        fused, plain = kernels.swiglu(x, gate_up), kernels.silu_mul(kernels.matmul(x, gate_up))
        for variant, fn in variants(x, weights).items():
            rows.append({"shape": name, "variant": variant, "us": round(gpu_us(fn), 2),
                         "same bits": torch.equal(fused, plain)})
            print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    (out / "kernels_swiglu.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    md = f"`python3 bench/kernels_swiglu.py` ({gpu}; one row, GPU us per MLP from CUDA-graph replays)\n\n{markdown_table(rows)}\n"
    (out / "kernels_swiglu.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
