"""Paged attention in plain torch: the fp32 reference and the vendor (SDPA) path.

Both read the same packed layout as the Triton kernels: queries of all
sequences packed along T, each sequence's queries being the LAST q_len of its
kv_len positions (causal, bottom-right aligned).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv_torch(k, v, k_cache, v_cache, slot_mapping) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[keep].to(v_cache.dtype)


def _gather_pages(cache, block_table_row, kv_len: int) -> torch.Tensor:
    """[kv_len, Hkv, D] of one sequence, in position order."""
    block_size = cache.shape[1]
    pages = block_table_row[: (kv_len + block_size - 1) // block_size].long()
    return cache[pages].flatten(0, 1)[:kv_len]


def paged_attention_reference(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale=None, *, compute_dtype=torch.float32,
) -> torch.Tensor:
    """Per sequence: gather its pages and do causal softmax attention in compute_dtype."""
    T, H, D = q.shape
    h_kv = k_cache.shape[2]
    scale = D ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for s, kv_len in enumerate(kv_lens.tolist()):
        q_s = q[cu[s]: cu[s + 1]].to(compute_dtype)
        q_len = q_s.shape[0]
        if q_len == 0:
            continue
        k_s = _gather_pages(k_cache, block_tables[s], kv_len).to(compute_dtype)
        v_s = _gather_pages(v_cache, block_tables[s], kv_len).to(compute_dtype)
        k_s = k_s.repeat_interleave(H // h_kv, dim=1)
        v_s = v_s.repeat_interleave(H // h_kv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q_s, k_s) * scale
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
        k_pos = torch.arange(kv_len, device=q.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[cu[s]: cu[s + 1]] = torch.einsum("hqk,khd->qhd", probs, v_s).to(q.dtype)
    return out


def paged_attention_sdpa(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, *, max_q_len, max_kv_len,
) -> torch.Tensor:
    """The vendor path: gather pages into padded [S, Hkv, max_kv, D], one masked SDPA call.

    Device-side indexing only (no host sync beyond the host bounds passed in),
    so the call works for every mix of prefill and decode in one batch.
    """
    T, H, D = q.shape
    S = kv_lens.shape[0]
    block_size = k_cache.shape[1]
    dev = q.device
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    kv_lens = kv_lens.long()

    kv_pos = torch.arange(max_kv_len, device=dev)
    page_idx = (kv_pos // block_size).clamp_max(block_tables.shape[1] - 1)[None].expand(S, -1)
    # Table entries past a sequence's length may hold anything: clamp to a real page, then zero
    # what was read there, since 0 * NaN from stale cache memory would poison the output.
    pages = block_tables.long().gather(1, page_idx).clamp(0, k_cache.shape[0] - 1)
    in_seq = (kv_pos[None, :] < kv_lens[:, None])[:, :, None, None]
    k = torch.where(in_seq, k_cache[pages, kv_pos % block_size], 0).transpose(1, 2)  # [S, Hkv, max_kv, D]
    v = torch.where(in_seq, v_cache[pages, kv_pos % block_size], 0).transpose(1, 2)

    q_idx = torch.arange(max_q_len, device=dev)
    q_valid = q_idx[None, :] < q_lens[:, None]                                   # [S, max_q]
    tokens = (cu_seqlens_q[:-1].long()[:, None] + q_idx[None, :]).clamp_max(T - 1)
    q_pad = q[tokens].transpose(1, 2)                                            # [S, H, max_q, D]
    q_pos = kv_lens[:, None] - q_lens[:, None] + q_idx[None, :]                  # [S, max_q]
    mask = (kv_pos[None, None, :] <= q_pos[:, :, None]) & q_valid[:, :, None]    # [S, max_q, max_kv]
    # Padding query rows see position 0 only, so no row is fully masked (which would give NaN).
    mask = mask | (~q_valid[:, :, None] & (kv_pos == 0)[None, None, :])
    o_pad = F.scaled_dot_product_attention(
        q_pad, k, v, attn_mask=mask[:, None], scale=scale, enable_gqa=H != k.shape[1])

    seq_of_token = torch.searchsorted(cu_seqlens_q[1:].long(), torch.arange(T, device=dev), right=True)
    local = torch.arange(T, device=dev) - cu_seqlens_q.long()[seq_of_token]
    return o_pad.transpose(1, 2)[seq_of_token, local]
