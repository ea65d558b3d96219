"""Batch-invariant RMSNorm: one program per row, the whole row in one block.

A row's sum of squares is one `tl.sum` over a block whose size depends only on
the hidden size H, so its reduction tree is the same for every M. The math is
fp32 with a single rounding to x's dtype at the end:
    out = x * rsqrt(mean(x^2) + eps) * weight
The fused variant first forms residual + x rounded to x's dtype (what a plain
`residual + x` in that dtype gives) and normalizes that.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.device import dependent_launch_options, early_launch, let_dependents_launch, wait_for_kernel_ahead
from kernels.launch import Launch, next_power_of_2
from kernels.mode import get_mode, use_triton
from kernels.partials import Partials, kernel_args, load_product
from kernels.toolchain import FP_FUSION

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    H, stride_x, stride_res, stride_out, stride_res_out, eps, stride_segment,
    HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
    SEGMENTS: tl.constexpr, PIPELINED: tl.constexpr,
):
    let_dependents_launch(EARLY)
    wait_for_kernel_ahead(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = load_product(x_ptr, row * stride_x + cols, mask, SEGMENTS, stride_segment, out_ptr.dtype.element_ty,
                     PIPELINED)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def _warps(block_h: int) -> int:
    # Enough threads that each holds 8-16 elements (16-byte loads), no more.
    return max(1, min(16, block_h // 512))


def _pipelines_partials(warps: int) -> bool:
    """Whether a norm adding a matmul's Partials issues all their loads up front (load_product's
    PIPELINED). Per step at one request, H200, against 97 us for the norms reading products: the
    0.6B shape's 2-warp norms (4-6 segments of 1,024) 164 us unrolled, 139 pipelined; the 8B shape's
    8-warp norms (4 segments of 4,096) cost its GPU step 58 us more pipelined than unrolled."""
    return warps <= 2


def _check(x: torch.Tensor | Partials, weight: torch.Tensor, residual: torch.Tensor | None = None) -> None:
    if len(x.shape) != 2:
        raise ValueError(f"rms_norm takes x as [M, H], got {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x must be one of {list(_DTYPES)}, got {x.dtype}")
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight must be [H={x.shape[1]}], got {tuple(weight.shape)}")
    if x.shape[1] > 0 and kernel_args(x)[0].stride(-1) != 1:
        raise ValueError("x must be contiguous along H")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check(x, weight)
    return _rms_norm_torch(x, weight, eps)


def _rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # The CPU backend runs this twice a layer on one row, where an op costs its dispatch, not its
    # arithmetic: the temporaries are updated in place (the same roundings as fresh results).
    xf = x.float()
    rstd = xf.pow(2).mean(dim=-1, keepdim=True).add_(eps).rsqrt_()
    return (xf * rstd).mul_(weight.float()).to(x.dtype)


def _rms_norm_triton(
    x: torch.Tensor | Partials, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
    early: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    M, H = x.shape
    out = weight.new_empty((M, H), dtype=x.dtype)
    res_out = torch.empty_like(out) if residual is not None else None
    if M == 0 or H == 0:
        return out, res_out
    xs, segments, stride_segment = kernel_args(x)
    res = residual if residual is not None else out
    res_dst = res_out if res_out is not None else out
    weight = weight.contiguous()
    if residual is not None and residual.stride(1) != 1:
        res = residual.contiguous()
    bound = _norm_launch(M, H, xs.stride(-2), res.stride(0), out.stride(0), res_dst.stride(0), eps, segments,
                         stride_segment, residual is not None, early_launch(early, out), out.device)
    bound(xs, res, weight, out, res_dst)
    return out, res_out


@functools.lru_cache(maxsize=4096, typed=True)   # typed: Triton compiles an eps of 1 and 1.0 apart
def _norm_launch(M, H, stride_x, stride_res, stride_out, stride_res_out, eps, segments, stride_segment, has_residual,
                 early, device) -> Launch:
    # Eager calls repeat a model's few shapes: everything but the tensors is worked out once.
    block_h = next_power_of_2(H)
    warps = _warps(block_h)
    return Launch(
        _rms_norm_kernel, (M,), (H, stride_x, stride_res, stride_out, stride_res_out, eps, stride_segment),
        HAS_RESIDUAL=has_residual, BLOCK_H=block_h, num_warps=warps,
        **dependent_launch_options(device), EARLY=early, enable_fp_fusion=FP_FUSION,
        SEGMENTS=segments, PIPELINED=_pipelines_partials(warps),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [M, H] (contiguous along H), weight: [H] -> [M, H] in x's dtype.

    Invariant mode gives row i the same bits for every M; standard mode runs
    torch's own fused RMSNorm.
    """
    _check(x, weight)
    if use_triton(x, weight):
        return _rms_norm_triton(x, None, weight, eps)[0]
    if get_mode() == "standard":
        return F.rms_norm(x, (x.shape[1],), weight.to(x.dtype), eps)
    return _rms_norm_torch(x, weight, eps)


def rms_norm_residual(
    x: torch.Tensor | Partials, residual: torch.Tensor, weight: torch.Tensor, eps: float, early: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused `s = residual + x; return rms_norm(s), s` in one pass over memory. x may be a matmul's
    Partials (kernels.matmul_partials), added here. early: a decode matmul that gains from
    launching early follows (kernels.launches_early)."""
    _check(x, weight, residual)
    if use_triton(kernel_args(x)[0], residual, weight):
        return _rms_norm_triton(x, residual, weight, eps, early)
    if isinstance(x, Partials):
        x = x.product()
    summed = residual + x
    if get_mode() == "standard":
        return F.rms_norm(summed, (x.shape[1],), weight.to(x.dtype), eps), summed
    return _rms_norm_torch(summed, weight, eps), summed
