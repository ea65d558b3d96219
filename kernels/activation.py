"""SwiGLU's elementwise half, `silu(gate) * up`, in one launch instead of torch's two, with
torch's bits: silu in fp32 as x / (1 + expf(-x)) (the same libdevice expf, an IEEE
division), rounded to the input dtype, then the product of the two rounded values
rounded once more. At decode the launch, not the arithmetic, is the cost.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from kernels.device import dependent_launch, wait_for_kernel_ahead

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, N, stride_x, stride_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_kernel_ahead(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + N + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_out + cols, silu_times(gate, up, False), mask=mask)


@triton.jit
def silu_times(gate, up, NUMPY_EXP: tl.constexpr):
    """silu(gate) * up in gate's dtype, with the roundings the module's docstring names. A kernel
    that calls it must be compiled with enable_fp_fusion=False: a contracted expf gives other bits.
    NUMPY_EXP: under the interpreter, which has no libdevice, numpy's expf stands in (tests)."""
    g = gate.to(tl.float32)
    if NUMPY_EXP:
        e = tl.exp(-g)
    else:
        e = libdevice.exp(-g)
    silu = tl.div_rn(g, 1.0 + e).to(gate.dtype)
    return (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2N] = [gate | up] -> silu(gate) * up [T, N], in x's dtype, in both kernel modes.

    CUDA runs the fused kernel; elsewhere (the CPU, where the interpreter has no libdevice)
    torch does.
    """
    gate, up = x.chunk(2, dim=-1)
    if not x.is_cuda:
        return F.silu(gate).mul_(up)   # in place: one [T, N] temporary fewer, the same product
    assert x.stride(1) == 1
    t, n = gate.shape
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    pdl = dependent_launch(x.device)
    if t and n:
        _silu_mul_kernel[(t, triton.cdiv(n, BLOCK))](x, out, n, x.stride(0), out.stride(0), BLOCK=BLOCK,
                                                   PDL=pdl, launch_pdl=pdl, num_warps=4, enable_fp_fusion=False)
    return out
