"""log_softmax's two paths on the GPU: the two-launch one against the one-launch one at
several lags (rows between a row's partials and its writers), V = 152064, graph clock,
same run; bits of every variant against the two-launch path. It picked
kernels/sampling_triton.py's _LAG and _ONE_LAUNCH_BYTES.

    python3 bench/kernels_log_softmax_lag.py

Prints one line per (dtype, batch): us and the fraction of the copy-bandwidth floor
(logits read once, fp32 output written once, at 2970 GB/s).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_dense import gpu_us, rotating  # noqa: E402
from kernels import sampling_triton as st  # noqa: E402

V = 152064


def main() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        for B in (16, 32, 64, 128, 256):
            x = torch.randn(B, V, device="cuda", dtype=dtype) * 3
            copies = rotating(lambda: x.clone(), x.numel() * x.element_size())
            floor = B * V * (x.element_size() + 4) / 2970e3  # us at 2970 GB/s
            st._ONE_LAUNCH_BYTES = 1 << 62
            two = st.log_softmax(x)
            row = [f"{str(dtype)[6:]:8s} B={B:3d} floor={floor:6.1f} two={gpu_us(lambda: st.log_softmax(copies())):6.1f}"]
            st._ONE_LAUNCH_BYTES = 0
            for lag in (8, 16, 32, 48, 64):
                st._LAG = {x.element_size(): lag}
                same = torch.equal(st.log_softmax(x), two)
                t = gpu_us(lambda: st.log_softmax(copies()))
                row.append(f"lag{lag}={t:6.1f}({floor / t:.2f}){'' if same else ' BITS'}")
            print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
