"""A split matmul's K segments, added by the kernel that reads its product.

At decode, and in batches of up to 128 rows, a split matmul (kernels.matmul) runs a program per K
segment, and the last program of a tile to finish used to add the segments' fp32 sums: an arrival
count and a reload of every segment, on the critical path of every projection. The kernels behind
the qkv, o and down projections (RoPE + KV write, the residual RMSNorm) read each element of the
product once anyway.
Handed the sums, they add them first to last, from zero, and round to the product's dtype: the
additions and the rounding the matmul's last program made. So they see the product's bits, and
the matmul ends at its last store.

One request's GPU step on an H200: 1,131 -> 1,066 us at the 0.6B shape, 4,664 -> 4,584 at the 8B
(bench/results/backend_partials_ab.md, backend_partials_8b_ab.md). A norm now reads 4-6 fp32
rows where it read one bf16 row, which gives back part of the gain; how it loads them
(load_product's PIPELINED) was measured per shape (kernels.norm._pipelines_partials).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class Partials(NamedTuple):
    """A [M, N] product in `dtype`, unsummed: sums[s] is its K segment s's fp32 sum."""
    sums: torch.Tensor   # [segments, M, N] fp32, contiguous
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.sums.shape[1:]

    def product(self) -> torch.Tensor:
        """The product, by torch: the same additions in the same order, then the one rounding."""
        total = torch.zeros_like(self.sums[0])
        for part in self.sums:
            total += part
        return total.to(self.dtype)


def kernel_args(x: torch.Tensor | Partials) -> tuple[torch.Tensor, int, int]:
    """(tensor, SEGMENTS, segment stride) for a kernel reading x with load_product: a product
    is read as it is (SEGMENTS 0), Partials through their sums."""
    if isinstance(x, Partials):
        return x.sums, x.sums.shape[0], x.sums.stride(0)
    return x, 0, 0


@triton.jit
def load_product(ptr, offs, mask, SEGMENTS: tl.constexpr, stride_segment, DTYPE: tl.constexpr,
                 PIPELINED: tl.constexpr):
    """The product's elements at offs (0 where masked): loaded, or added from its SEGMENTS sums
    (kernel_args) as the matmul's last program added them, and rounded to DTYPE. PIPELINED: every
    segment's load is issued up front (speed only: the same additions either way)."""
    if SEGMENTS == 0:
        return tl.load(ptr + offs, mask=mask, other=0.0)
    else:
        # The additions of _matmul_kernel's last program, which must stay alike (tests/kernels/
        # test_partials.py holds them equal). From zero: 0 + (-0) is +0, the first sum alone -0.
        total = tl.full(offs.shape, 0.0, tl.float32)
        if PIPELINED:
            # Asynchronous copies through shared memory, all issued before the first add.
            for s in tl.range(0, SEGMENTS, num_stages=SEGMENTS + 1):
                total += tl.load(ptr + s * stride_segment + offs, mask=mask, other=0.0)
        else:
            # Unrolled: ptxas keeps about eight 16-byte loads a thread in flight.
            for s in tl.static_range(SEGMENTS):
                total += tl.load(ptr + s * stride_segment + offs, mask=mask, other=0.0)
        return total.to(DTYPE)
