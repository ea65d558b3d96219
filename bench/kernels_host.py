"""Host cost of one eager kernel call at decode size, invariant (Triton) against the vendor op.

Outside a CUDA graph (prefill chunks the graphs do not cover, mixed steps, --no-cuda-graphs)
the CPU time a call takes to launch, not the GPU's, sets the pace at small sizes. The host cost
is the median wall time of the Python call itself (no sync inside: the GPU work of these sizes
is a few microseconds, so the launch queue never fills and the call returns as soon as it has
launched), over 10 rounds in which each op's invariant and vendor calls take 30 turns each, so
that both sides see the same drift of a noisy host. Shapes are the 0.6B model's: hidden 1024,
16 query / 8 KV heads of 128, a 200-token context.

    python3 bench/kernels_host.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels.rotary import rope_store_kv_reference  # noqa: E402


def paired_us(sides: dict, rounds: int = 10, turns: int = 30) -> dict:
    """{side: (mode, fn)} -> {side: median us of one call}, the sides taking turns."""
    times = {side: [] for side in sides}
    for mode, fn in sides.values():
        with kernels.mode(mode):
            for _ in range(20):
                fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for side, (mode, fn) in sides.items():
            with kernels.mode(mode):
                for _ in range(turns):
                    t = time.perf_counter()
                    fn()
                    times[side].append(time.perf_counter() - t)
            torch.cuda.synchronize()
    return {side: round(statistics.median(ts) * 1e6, 1) for side, ts in times.items()}


def ops() -> dict:
    dev, bf = "cuda", torch.bfloat16
    x, w = torch.randn(1, 1024, device=dev, dtype=bf), torch.randn(4096, 1024, device=dev, dtype=bf)
    h, g = torch.randn(1, 1024, device=dev, dtype=bf), torch.randn(1024, device=dev, dtype=bf)
    blocks, page = 64, 16
    kc, vc = (torch.randn(blocks, page, 8, 128, device=dev, dtype=bf) for _ in range(2))
    q = torch.randn(1, 16, 128, device=dev, dtype=bf)
    table = torch.arange(16, device=dev, dtype=torch.int32)[None]
    cu, lens = torch.tensor([0, 1], device=dev, dtype=torch.int32), torch.tensor([200], device=dev, dtype=torch.int32)
    qkv = torch.randn(1, 4096, device=dev, dtype=bf)
    cos, sin = torch.randn(4096, 64, device=dev), torch.randn(4096, 64, device=dev)
    pos, slot = torch.tensor([199], device=dev), torch.tensor([199], device=dev)
    norms = (torch.randn(128, device=dev, dtype=bf), torch.randn(128, device=dev, dtype=bf))
    gate_up = torch.randn(1, 6144, device=dev, dtype=bf)
    logits = torch.randn(1, 151936, device=dev)
    seeds, steps = torch.zeros(1, dtype=torch.int64, device=dev), torch.zeros(1, dtype=torch.int64, device=dev)
    temp, top_k, top_p = (torch.full((1,), 0.8, device=dev), torch.zeros(1, dtype=torch.int32, device=dev),
                          torch.ones(1, device=dev))

    def attention():
        return kernels.paged_attention(q, kc, vc, table, cu, lens, max_q_len=1, max_kv_len=200)

    def sample():
        return kernels.sample(logits, seeds, steps, temp, top_k, top_p, filtered=False)

    api = {
        "matmul 1x1024 @ 1024x4096": lambda: kernels.matmul(x, w.t()),
        "rms_norm 1x1024": lambda: kernels.rms_norm(h, g, 1e-6),
        "rms_norm_residual 1x1024": lambda: kernels.rms_norm_residual(h, h, g, 1e-6),
        "paged_attention decode, 1 x 200": attention,
        "sample 1x151936 (temperature)": sample,
    }
    pairs = {op: {"invariant": ("invariant", fn), "standard": ("standard", fn)} for op, fn in api.items()}
    # The fused elementwise launches serve both modes; against the torch steps they replace.
    def rope(fn):
        return lambda: fn(qkv, pos, cos, sin, kc, vc, slot, 16, 8, *norms, 1e-6)

    pairs["q/k norm + RoPE + KV write"] = {"invariant": ("invariant", rope(kernels.rope_store_kv)),
                                           "standard": ("standard", rope(rope_store_kv_reference))}
    pairs["silu(gate) * up 1x3072"] = {
        "invariant": ("invariant", lambda: kernels.silu_mul(gate_up)),
        "standard": ("standard", lambda: torch.nn.functional.silu(gate_up[:, :3072]) * gate_up[:, 3072:]),
    }
    rows = {"invariant": {}, "standard": {}}
    for op, sides in pairs.items():
        for side, us in paired_us(sides).items():
            rows[side][op] = us
    return rows


def table(rows: dict) -> str:
    lines = ["| op (one eager call) | invariant / fused, us | vendor / torch, us | ratio |", "|---|---|---|---|"]
    for op, inv in rows["invariant"].items():
        std = rows["standard"][op]
        lines.append(f"| {op} | {inv} | {std} | {inv / std:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    rows = ops()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_host.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    text = table(rows)
    (out / "kernels_host.md").write_text(f"# Host cost of one eager call, {torch.cuda.get_device_name()}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
