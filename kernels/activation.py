"""SwiGLU's elementwise half, `silu(gate) * up`, in one launch instead of torch's two, with
torch's bits: silu in fp32 as x / (1 + expf(-x)) (the same libdevice expf, an IEEE
division), rounded to the input dtype, then the product of the two rounded values
rounded once more. A batch runs this kernel; at decode, where the launch and not the
arithmetic is the cost, the gate_up matmul's epilogue applies the same formula (kernels.swiglu).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from kernels.device import dependent_launch_options, wait_for_kernel_ahead
from kernels.launch import cdiv, launch

BLOCK = 1024


@triton.jit
def silu_times(gate, up, LIBDEVICE: tl.constexpr):
    """silu(gate) * up of two tensors in the model's dtype, with torch's roundings (the module's
    docstring); the SiLU·up kernel's and the fused gate_up matmul's (kernels.swiglu) one formula.
    LIBDEVICE: CUDA's expf, torch's; the interpreter has no libdevice, and its exp is numpy's."""
    g = gate.to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = tl.div_rn(g, 1.0 + e).to(gate.dtype)
    return (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, N, stride_x, stride_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_kernel_ahead(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + N + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_out + cols, silu_times(gate, up, True), mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2N] = [gate | up] -> silu(gate) * up [T, N], in x's dtype, in both kernel modes. The
    model's large batches take it; where the split kernel runs, kernels.swiglu's epilogue.

    CUDA runs the fused kernel; elsewhere (the CPU, where the interpreter has no libdevice)
    torch does.
    """
    gate, up = x.chunk(2, dim=-1)
    if not x.is_cuda:
        return F.silu(gate).mul_(up)   # in place: one [T, N] temporary fewer, the same product
    assert x.stride(1) == 1
    t, n = gate.shape
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if t and n:
        launch(_silu_mul_kernel, (t, cdiv(n, BLOCK)), x, out, n, x.stride(0), out.stride(0), BLOCK=BLOCK,
               **dependent_launch_options(x.device), num_warps=4, enable_fp_fusion=False)
    return out
