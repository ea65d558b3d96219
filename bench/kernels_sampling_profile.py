"""Where a filtered sampler call spends its GPU time, kernel by kernel.

For bf16 logits at V = 152064 and B in {1, 256}, one row each of top-k 50, top-p 0.9 and
top-k 8000 (past the candidate list's cap, so the radix select runs), it profiles 5 calls
of kernels.sample (invariant mode, filtered=True) with torch.profiler and prints each
kernel's mean GPU time per call. Launch gaps are not counted: the bench's graph clock
(bench/kernels_sampling.py) is the one to compare against torch.

    python3 bench/kernels_sampling_profile.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import mode, sampling  # noqa: E402

VOCAB = 152064
CALLS = 5
CASES = {"top-k 50": (50, 1.0), "top-p 0.9": (0, 0.9), "top-k 8000": (8000, 1.0)}


def per_kernel_us(batch: int, top_k: int, top_p: float) -> dict[str, float]:
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = (torch.randn(batch, VOCAB, device="cuda", generator=g) * 4).to(torch.bfloat16)
    args = (torch.arange(batch, device="cuda") * 1000003 + 17, torch.full((batch,), 7, device="cuda"),
            torch.full((batch,), 0.8, device="cuda"), torch.full((batch,), top_k, dtype=torch.int32, device="cuda"),
            torch.full((batch,), top_p, device="cuda"))
    with mode("invariant"):
        for _ in range(3):  # compile and warm up
            sampling.sample(x, *args, filtered=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                sampling.sample(x, *args, filtered=True)
            torch.cuda.synchronize()
    times = {ev.key: ev.device_time_total / CALLS for ev in prof.key_averages() if ev.device_time_total > 0}
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    lines = []
    for batch in (1, 256):
        for name, (top_k, top_p) in CASES.items():
            times = per_kernel_us(batch, top_k, top_p)
            parts = ", ".join(f"{kernel.strip('_')} {us:.1f}" for kernel, us in times.items() if us >= 0.5)
            lines.append(f"bf16 B={batch} {name}: {sum(times.values()):.1f} us | {parts}")
            print(lines[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_sampling_profile.log").write_text(f"{torch.cuda.get_device_name()}\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
