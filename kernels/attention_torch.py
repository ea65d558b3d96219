"""Paged attention in plain torch: the fp32 reference, the CPU backend's path and the vendor (SDPA) path.

All read the same packed layout as the Triton kernels: queries of all
sequences packed along T, each sequence's queries being the LAST q_len of its
kv_len positions (causal, bottom-right aligned).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv_torch(k, v, k_cache, v_cache, slot_mapping) -> None:
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    # A cache [blocks, block_size, Hkv, D] is a row per slot once its first two axes are merged.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _pages(table_row: list[int], kv_len: int, block_size: int, device) -> torch.Tensor:
    """The cache index of a sequence's pages, in position order."""
    return torch.tensor(table_row[: (kv_len + block_size - 1) // block_size], device=device)


def _sequence_kv(k_cache, v_cache, pages: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [kv_len, Hkv, D] of one sequence, in position order, copied out of the cache even
    where its pages are consecutive: SDPA reads one head at a time, which in the pages (heads
    interleaved, cold once a decode step's weights have streamed through the caches) is slower
    than one sequential copy and reads of the hot copy (bench/results/backend_cpu_smollm2.md)."""
    return k_cache.index_select(0, pages).flatten(0, 1)[:kv_len], v_cache.index_select(0, pages).flatten(0, 1)[:kv_len]


# Query rows a reference prefill takes at a time: each block reads keys only up to its own
# last position, so a prompt costs half the products of a whole square, in bounded memory.
REFERENCE_QUERY_BLOCK = 128


def paged_attention_reference(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale=None, *, compute_dtype=torch.float32,
) -> torch.Tensor:
    """Per sequence: causal softmax attention over its pages in compute_dtype.

    The G query heads of a KV head go through one batched product with that head's keys
    and values (rows (head, position) of a [Hkv, G * rows, D] operand), so KV is never
    copied once per query head.
    """
    T, H, D = q.shape
    h_kv = k_cache.shape[2]
    G = H // h_kv
    scale = D ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    cu, tables = cu_seqlens_q.tolist(), block_tables.tolist()
    for s, kv_len in enumerate(kv_lens.tolist()):
        k_s, v_s = _sequence_kv(k_cache, v_cache, _pages(tables[s], kv_len, k_cache.shape[1], k_cache.device), kv_len)
        k_s = k_s.to(compute_dtype).permute(1, 2, 0)   # [Hkv, D, kv]
        v_s = v_s.to(compute_dtype).transpose(0, 1)    # [Hkv, kv, D]
        first = kv_len - (cu[s + 1] - cu[s])   # the position of the sequence's first query
        for a in range(cu[s], cu[s + 1], REFERENCE_QUERY_BLOCK):
            b = min(a + REFERENCE_QUERY_BLOCK, cu[s + 1])
            rows, end = b - a, first + b - cu[s]   # this block's queries see keys [0, end)
            q_b = q[a:b].to(compute_dtype).view(rows, h_kv, G, D).permute(1, 2, 0, 3).reshape(h_kv, G * rows, D)
            scores = torch.bmm(q_b, k_s[:, :, :end]).mul_(scale).view(h_kv, G, rows, end)
            if rows > 1:
                q_pos = torch.arange(end - rows, end, device=q.device)
                scores.masked_fill_(torch.arange(end, device=q.device) > q_pos[:, None], float("-inf"))
            o = torch.bmm(scores.view(h_kv, G * rows, end).softmax(dim=-1), v_s[:, :end])   # [Hkv, G*rows, D]
            out[a:b].view(rows, h_kv, G, D).copy_(o.view(h_kv, G, rows, D).permute(2, 0, 1, 3))
    return out


def per_sequence_plan(k_cache, block_tables, cu_seqlens_q, kv_lens) -> list[tuple]:
    """What paged_attention_per_sequence reads from the host, read once for all the layers of a
    forward pass: for each sequence with queries, its rows a:b of q, its pages, its KV length and
    its causal mask, None where a lone query needs none or SDPA's own causal rule stands in."""
    plan = []
    cu, tables = cu_seqlens_q.tolist(), block_tables.tolist()
    for s, kv_len in enumerate(kv_lens.tolist()):
        a, b = cu[s], cu[s + 1]
        if a == b:
            continue
        # A lone query (decode) sees every position. Queries over all of a sequence's positions
        # (a prompt's first chunk) take is_causal, which skips the key blocks above the diagonal
        # and gives the mask's bits: a skipped block only adds zeros and rescales by exp(0).
        # Other chunks are causal aligned to the last position (row i sees keys up to
        # kv_len - q_len + i), which is_causal (aligned to the first) cannot say.
        mask = None
        if 1 < b - a < kv_len:
            positions = torch.arange(kv_len, device=k_cache.device)
            mask = positions <= positions[kv_len - (b - a):, None]
        plan.append((a, b, _pages(tables[s], kv_len, k_cache.shape[1], k_cache.device), kv_len, mask))
    return plan


def paged_attention_per_sequence(q, k_cache, v_cache, plan: list[tuple], scale) -> torch.Tensor:
    """The CPU backend's path: one fused torch SDPA call per sequence of the plan (per_sequence_plan)
    over its own pages, with the query heads of a KV head sharing it (enable_gqa) and no padding.
    The reference above spells the arithmetic out; this is the same function at the speed of
    transformers' own CPU attention."""
    H, h_kv = q.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for a, b, pages, kv_len, mask in plan:
        k, v = (x.transpose(0, 1)[None] for x in _sequence_kv(k_cache, v_cache, pages, kv_len))   # [1, Hkv, kv, D]
        o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1)[None], k, v, attn_mask=mask,
                                           is_causal=mask is None and b - a > 1, scale=scale, enable_gqa=H != h_kv)
        out[a:b] = o[0].transpose(0, 1)
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
