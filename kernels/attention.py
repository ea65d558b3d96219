"""Paged-KV attention: the public entry points and their dispatch on the kernel mode.

invariant (CUDA, or CPU under TRITON_INTERPRET=1) -> the batch-invariant Triton
kernels; standard -> FlashAttention-2 (varlen, from torch) over pages gathered by a
per-forward plan on CUDA in 16-bit (kernels/attention_vendor.py), torch SDPA over padded
pages elsewhere; anything else (invariant on a CPU without the interpreter: the CPU
backend) -> one torch SDPA call per sequence over its pages.
"""
from __future__ import annotations

import torch

from kernels import attention_vendor
from kernels.attention_torch import (paged_attention_per_sequence, paged_attention_reference, paged_attention_sdpa,
                                     per_sequence_plan, store_kv_torch)
from kernels.attention_triton import paged_attention_triton, store_kv_triton
from kernels.mode import get_mode, interpreting, use_triton

__all__ = ["attention_plan", "paged_attention", "paged_attention_reference", "store_kv"]


def attention_plan(k_cache, block_tables, cu_seqlens_q, kv_lens, max_kv_len: int):
    """What every layer's paged_attention call of one forward pass shares, built once (pass it
    as `plan`): standard mode's page gather on CUDA, the CPU backend's host-side reading of the
    batch; None where nothing is shared."""
    if get_mode() == "standard" and attention_vendor.supported(k_cache):
        return attention_vendor.plan(k_cache, block_tables, kv_lens, max_kv_len)
    if get_mode() == "invariant" and not use_triton(k_cache):
        return per_sequence_plan(k_cache, block_tables, cu_seqlens_q, kv_lens)
    return None


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write k, v [T, Hkv, D] into the caches [num_blocks, block_size, Hkv, D] at slot_mapping [T].

    slot = block_id * block_size + offset; a slot of -1 is skipped (padding tokens).
    A copy has no summation order, so both modes share one kernel: Triton where it
    runs, torch indexing elsewhere.
    """
    if k_cache.is_cuda or interpreting():
        store_kv_triton(k, v, k_cache, v_cache, slot_mapping)
    else:
        store_kv_torch(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale=None, *,
    max_q_len=None, max_kv_len=None, plan=None, early=False,
) -> torch.Tensor:
    """Causal attention of packed queries q [T, H, D] over a paged KV cache; returns [T, H, D].

    Sequence s owns q rows cu_seqlens_q[s]:cu_seqlens_q[s+1], which are its LAST
    positions: kv_lens[s] - q_len_s ... kv_lens[s] - 1. Prefill, chunked prefill
    over a cached prefix, decode (q_len 1) and mixes of them are one call.
    Pass max_q_len / max_kv_len (host-side upper bounds) to avoid a device sync,
    e.g. under CUDA-graph capture, and `plan` (attention_plan of the same batch) to share
    work between the layers of one forward pass. early: a decode matmul that gains from
    launching early follows (kernels.launches_early).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    if max_kv_len is None:
        max_kv_len = int(kv_lens.max())
    args = (q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale)
    if use_triton(q, k_cache, v_cache):
        return paged_attention_triton(*args, max_q_len=max_q_len, max_kv_len=max_kv_len, early=early)
    if get_mode() == "standard" and attention_vendor.supported(q):
        plan = plan or attention_vendor.plan(k_cache, block_tables, kv_lens, max_kv_len)
        return attention_vendor.paged_attention_flash(q, k_cache, v_cache, cu_seqlens_q, scale, plan,
                                                      max_q_len=max_q_len, max_kv_len=max_kv_len)
    if get_mode() == "standard":
        return paged_attention_sdpa(*args, max_q_len=max_q_len, max_kv_len=max_kv_len)
    plan = plan or per_sequence_plan(k_cache, block_tables, cu_seqlens_q, kv_lens)
    return paged_attention_per_sequence(q, k_cache, v_cache, plan, scale)
