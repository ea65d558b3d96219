"""Standard mode's paged attention on CUDA: as fast as the image's libraries allow.

The image has no paged-attention kernel (no flash-attn, FlashInfer or FlashAttention-3
package; torch's vendored FlashAttention-2 takes no block table). So each layer gathers its
sequences' pages into one packed K and V, positions in order and sequences back to back,
and FlashAttention-2's variable-length kernel attends over them: causal from the bottom
right, GQA without copies, no padding read and no mask (the gather path before this one
padded every sequence to the longest and ran masked SDPA, which also expanded K/V per
query head). The packed buffer is sized by the host's KV bound, so a CUDA graph can hold
it. Which slot feeds which packed row is the same for every layer: `plan` finds it once per
forward pass, and the layers only gather.
"""
from __future__ import annotations

import torch


def plan(k_cache, block_tables, kv_lens, max_kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens_k int32 [S+1], the cache slot of every packed row [S * max_kv_len])."""
    S, block_size = kv_lens.shape[0], k_cache.shape[1]
    cu_k = torch.zeros(S + 1, dtype=torch.int32, device=kv_lens.device)
    cu_k[1:] = torch.cumsum(kv_lens, 0, dtype=torch.int32)
    row = torch.arange(S * max(max_kv_len, 1), dtype=torch.int32, device=kv_lens.device)
    seq = torch.searchsorted(cu_k[1:], row, right=True).clamp_max(S - 1)
    pos = (row - cu_k[seq]).clamp(0, block_tables.shape[1] * block_size - 1)
    slot = block_tables[seq, pos // block_size].long() * block_size + pos % block_size
    # Rows past the last sequence are never read; point them at slot 0 rather than at table junk.
    return cu_k, torch.where(row < cu_k[-1], slot, 0)


def paged_attention_flash(q, k_cache, v_cache, cu_seqlens_q, scale, attention_plan, *, max_q_len, max_kv_len):
    cu_k, slots = attention_plan
    k = k_cache.flatten(0, 1).index_select(0, slots)
    v = v_cache.flatten(0, 1).index_select(0, slots)
    return torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens_q, cu_k, max_q_len, max_kv_len, 0.0, True, False, scale=scale)[0]


def supported(q_or_cache: torch.Tensor) -> bool:
    return q_or_cache.is_cuda and q_or_cache.dtype in (torch.float16, torch.bfloat16) and q_or_cache.shape[-1] <= 256
