"""One launch from the qkv projection to attention's inputs: per-head q/k RMSNorm (Qwen3),
rotate-half RoPE, and the KV-cache write, bit for bit what the separate steps give.

The separate steps were a norm launch for q and one for k, a dozen torch elementwise
launches for RoPE and a KV-cache write: at decode, where a layer's weights take a few
microseconds to read, those launches set the pace. Fused, every value still takes
the same roundings:
- the norm is kernels/norm.py's row arithmetic statement for statement, with the same
  block, warps and FMA contraction, and its bf16 result is stored before RoPE reads it
  back, so the sum of squares is reduced exactly as the norm kernel reduces it;
- RoPE is torch's fp32 `x1*cos - x2*sin, x2*cos + x1*sin`, each product rounded on its
  own (mul.rn, which no FMA contraction touches), then one rounding to the cache dtype;
- v is copied. A slot of -1 (padding) writes neither k nor v.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention import store_kv
from kernels.device import dependent_launch_options, wait_for_kernel_ahead
from kernels.launch import launch, next_power_of_2
from kernels.mode import interpreting
from kernels.norm import _warps, rms_norm
from kernels.partials import Partials, kernel_args, load_product
from kernels.toolchain import FP_FUSION


@triton.jit
def _mul_rn(a, b, ASM: tl.constexpr):
    # An explicitly rounded product: with FMA contraction on (which the norm needs), a
    # plain a * b could be fused into the subtraction that follows it.
    if ASM:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return a * b


@triton.jit
def _rope_store_kernel(
    qkv_ptr, q_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
    H, HALF, eps,
    stride_t, stride_qt, stride_qh, stride_cos, stride_cb, stride_cp, stride_ch, stride_segment,
    HQ: tl.constexpr, HKV: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    NORM: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr, SEGMENTS: tl.constexpr,
):
    wait_for_kernel_ahead(PDL)
    # A qkv product's sums are read unrolled (load_product's PIPELINED off): a head is one warp over
    # two segments, and pipelined the 0.6B step's RoPE took 63 us against 53 (H200).
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + t)
    src = qkv_ptr + t * stride_t + head * H
    cache = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_cp + ((head - HQ) % HKV) * stride_ch
    if head < HQ:
        dst = q_ptr + t * stride_qt + head * stride_qh
    elif head < HQ + HKV:
        dst = k_cache_ptr + cache
    else:
        dst = v_cache_ptr + cache
    if (head < HQ) | (slot >= 0):
        cols = tl.arange(0, BLOCK_H)
        mask = cols < H
        if head >= HQ + HKV:
            v = load_product(src, cols, mask, SEGMENTS, stride_segment, q_ptr.dtype.element_ty, False)
            tl.store(dst + cols, v.to(dst.dtype.element_ty), mask=mask)
        else:
            j = tl.arange(0, BLOCK_HALF)
            half = j < HALF
            if NORM:
                if head < HQ:
                    w_ptr = q_norm_ptr
                else:
                    w_ptr = k_norm_ptr
                x = load_product(src, cols, mask, SEGMENTS, stride_segment, q_ptr.dtype.element_ty, False)
                xf = x.to(tl.float32)
                rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
                w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dst + cols, (xf * rstd * w).to(dst.dtype.element_ty), mask=mask)
                tl.debug_barrier()   # every thread's normed elements stored before any is read back
                x1 = tl.load(dst + j, mask=half, other=0.0).to(tl.float32)
                x2 = tl.load(dst + HALF + j, mask=half, other=0.0).to(tl.float32)
            else:
                x1 = load_product(src, j, half, SEGMENTS, stride_segment, q_ptr.dtype.element_ty, False)
                x2 = load_product(src, HALF + j, half, SEGMENTS, stride_segment, q_ptr.dtype.element_ty, False)
                x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
            pos = tl.load(pos_ptr + t)
            c = tl.load(cos_ptr + pos * stride_cos + j, mask=half, other=0.0)
            s = tl.load(sin_ptr + pos * stride_cos + j, mask=half, other=0.0)
            o1 = _mul_rn(x1, c, ASM) - _mul_rn(x2, s, ASM)
            o2 = _mul_rn(x2, c, ASM) + _mul_rn(x1, s, ASM)
            # Each thread writes back only the elements it read: no barrier needed here.
            tl.store(dst + j, o1.to(dst.dtype.element_ty), mask=half)
            tl.store(dst + HALF + j, o2.to(dst.dtype.element_ty), mask=half)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated by cos, sin [T, D/2] (fp32), rotate-half layout, in torch: each
    product rounded on its own, then `x1*cos - x2*sin, x2*cos + x1*sin`."""
    t = x.shape[0]
    halves = x.float().unflatten(-1, (2, -1))   # [T, heads, 2, D/2]: x1, x2
    cos, sin = cos.view(t, 1, 1, -1), sin.view(t, 1, 1, -1)
    # At decode an op costs its dispatch, not its arithmetic: the four products in two ops, the
    # sums in place.
    out = halves * cos
    x1_sin, x2_sin = (halves * sin).unbind(-2)
    o1, o2 = out.unbind(-2)
    o1.sub_(x2_sin)
    o2.add_(x1_sin)
    return out.flatten(-2).to(x.dtype)


def rope_store_kv_reference(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
                            q_norm=None, k_norm=None, eps=1e-6) -> torch.Tensor:
    """The unfused steps: per-head norms through kernels.rms_norm, RoPE in torch, kernels.store_kv.

    q and k are adjacent in qkv and rotate alike (elementwise: the bits of a head do not depend
    on its neighbours), so one rotation covers both."""
    d = k_cache.shape[-1]
    heads = qkv.unflatten(1, (-1, d))   # [T, Hq + 2 Hkv, D]
    qk, v = heads[:, :num_heads + num_kv_heads], heads[:, num_heads + num_kv_heads:]
    if q_norm is not None:
        q, k = qk.split([num_heads, num_kv_heads], dim=1)
        qk = torch.cat((rms_norm(q.reshape(-1, d), q_norm, eps).view_as(q),
                        rms_norm(k.reshape(-1, d), k_norm, eps).view_as(k)), dim=1)
    qk = rope_reference(qk, cos.index_select(0, positions), sin.index_select(0, positions))
    store_kv(qk[:, num_heads:], v, k_cache, v_cache, slot_mapping)
    return qk[:, :num_heads].contiguous()   # compact, as the fused kernel's q (a copy unless T is 1)


def rope_store_kv(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
                  q_norm=None, k_norm=None, eps=1e-6) -> torch.Tensor:
    """qkv [T, (Hq + 2 Hkv) * D] (rows may be strided, or a matmul's Partials, added here) -> q [T,
    Hq, D] normed and rotated; k (normed, rotated) and v written to the caches [blocks,
    block_size, Hkv, D] at slot_mapping.

    cos, sin: [positions, D/2] fp32 tables; positions int64 [T]. q_norm / k_norm: [D] weights
    of a per-head RMSNorm before RoPE, or None. Both kernel modes run the fused kernel on
    CUDA (and under the interpreter); elsewhere the unfused torch steps run.
    """
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    qkv_arg, segments, stride_segment = kernel_args(qkv)
    if not (qkv_arg.is_cuda or interpreting()):
        qkv = qkv.product() if isinstance(qkv, Partials) else qkv
        return rope_store_kv_reference(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
                                       num_heads, num_kv_heads, q_norm, k_norm, eps)
    assert qkv_arg.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    assert d % 2 == 0 and cos.stride(1) == 1 and cos.stride() == sin.stride()
    q = torch.empty(t, num_heads, d, dtype=qkv.dtype, device=qkv_arg.device)
    if t == 0:
        return q
    norm = q_norm is not None
    block_h = next_power_of_2(d)
    launch(_rope_store_kernel, (t, num_heads + 2 * num_kv_heads),
        qkv_arg, q, q_norm if norm else q, k_norm if norm else q, cos, sin, positions, slot_mapping,
        k_cache, v_cache,
        d, d // 2, eps,
        qkv_arg.stride(-2), q.stride(0), q.stride(1), cos.stride(0), *k_cache.stride()[:3], stride_segment,
        HQ=num_heads, HKV=num_kv_heads, PAGE=k_cache.shape[1], BLOCK_H=block_h,
        BLOCK_HALF=next_power_of_2(d // 2), NORM=norm, ASM=qkv_arg.is_cuda, SEGMENTS=segments,
        **dependent_launch_options(q.device),
        num_warps=_warps(block_h), enable_fp_fusion=FP_FUSION,
    )
    return q
