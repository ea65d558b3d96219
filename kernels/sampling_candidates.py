"""Top-k / top-p from a short candidate list: the common case, four launches.

A kept set is a prefix of the rank order (score descending, ties by lowest id), and
real rows keep few tokens. So:
  1. histogram: one program per part of a row (the chunks one pass-1 program takes)
     counts its tokens by how far below the row max their score lies, in buckets of
     1 / _STEP; the last bucket takes the rest (and the padding past V). Integer
     counts only: their order of summation does not matter.
  2. choose: one program per row merges the counts and finds the first bucket by
     which the kept set has provably ended: top-k's count reached, top-p's mass
     reached (the buckets past it hold at most their counts times the exp of their
     near edges), or the whole row counted. The tokens up to it are a prefix of the rank
     order with its ties whole: the row's list.
  3. gather: one program per part writes its tokens of the list as (rank key, id), each
     in a slot taken from a per-row atomic count. The slots' order varies from run to
     run; the list's contents do not, and the settle sorts them before any sum.
  4. settle: one program per row sorts the list, sums the masses down the ranks in
     fp32 and keeps the shortest prefix meeting an active condition, the reference's
     rule (kernels/sampling.py); then sorts the kept set by id and inverts its CDF at
     the row's u, as the pick does for a row without filters.
A row whose list would pass _CAP tokens, or whose list ends before the rank where the
kept set does (masses the bound cannot see, -inf tails under top-k), stays unsettled
and kernels/sampling_filter.py's radix select takes it. Which path a row takes, and
the order of every float sum on it, depend on that row alone.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.philox import row_uniform
from kernels.sampling_rows import (crossing, from_order_key, load_partials, merged_mass, order_key, row_params,
                                   scaled_chunk)

# _STEP and _BUCKETS only choose which rows take this path (buckets of 1/8 of a unit of
# scaled score, 16 units deep); _CAP and _SMALL fix the sort widths, and with them the
# order of the mass sums, so changing either moves KERNEL_VERSION. The tile sizes only
# shape loops (H100, B = 256, bf16): the histogram bins a whole part (2 chunks of 4096)
# at once, 104 us against 120 in 2048-token tiles, its loads all in flight together;
# the gather, which holds more per token, takes 2048 (79 us; 169 with the whole part,
# its registers leaving one program per SM).
_STEP = 8
_BUCKETS = 128
_CAP = 2048
_SMALL = 256
_HISTOGRAM_TILE = 8192
_GATHER_TILE = 2048
_WARPS = 8
_LAST = tl.constexpr(2**63 - 1)


@triton.jit
def _bucket(s, ref, STEP: tl.constexpr, BUCKETS: tl.constexpr):
    # Monotone in s (rounded subtraction is), so every bucket prefix is a rank prefix.
    # -inf, nan and past-the-edge scores compare false and land in the last bucket.
    depth = (ref - s) * STEP
    return tl.where(depth < BUCKETS - 1, depth, BUCKETS - 1.0).to(tl.int32)


@triton.jit
def _entry(key, ids):
    # A list entry: ~key in the high half, the id in the low. Ascending order of entries is
    # rank order: score descending, then lowest id.
    return ((~key).to(tl.int64) << 32) | ids.to(tl.int64)


@triton.jit
def _key_and_id(entry):
    return ~(entry >> 32).to(tl.int32), (entry & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def _histogram_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, hist_ptr, V, C, P,
                      BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CP: tl.constexpr, SUB: tl.constexpr,
                      STEP: tl.constexpr, BUCKETS: tl.constexpr):
    p = tl.program_id(0)
    row = tl.program_id(1)
    greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    if k_on | p_on:
        ref, _, _ = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        base = x_ptr + row.to(tl.int64) * stride
        counts = tl.zeros([BUCKETS], tl.int32)
        # (the padding past V scores -inf: last bucket, which no list reaches)
        first = p * CHUNKS * BLOCK
        for start in range(first, first + CHUNKS * BLOCK, SUB):
            bucket = _bucket(scaled_chunk(base, start + tl.arange(0, SUB), V, inverse)[0], ref, STEP, BUCKETS)
            # A tile wholly in the last bucket changes no count that is ever read: skip its binning.
            if tl.min(bucket, axis=0) < BUCKETS - 1:
                counts += tl.histogram(bucket, BUCKETS)
        tl.store(hist_ptr + (row * P + p) * BUCKETS + tl.arange(0, BUCKETS), counts)


@triton.jit
def _choose_kernel(temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, hist_ptr, last_ptr, size_ptr, fill_ptr, V, C, P,
                   CP: tl.constexpr, PP: tl.constexpr, STEP: tl.constexpr, BUCKETS: tl.constexpr, CAP: tl.constexpr):
    """Per row: the last bucket of the list (-1: no list) and its size; the gather's slot count zeroed."""
    row = tl.program_id(0)
    greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    last = tl.full([], -1, tl.int32)
    size = tl.full([], -1, tl.int32)
    if k_on | p_on:
        ref, _, total = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        parts = tl.arange(0, PP)
        j = tl.arange(0, BUCKETS)
        hist = tl.load(hist_ptr + (row * P + parts[:, None]) * BUCKETS + j[None, :], mask=parts[:, None] < P, other=0)
        counts = tl.sum(hist, axis=0)
        run = tl.cumsum(counts, axis=0)
        # The mass past bucket j is at most each later bucket's count times the exp of its near
        # edge; the rest of the row's total mass is then in buckets <= j. The row's mass is
        # mostly near the top, so this bounds it far tighter than summing far edges upwards.
        ceiling = counts.to(tl.float32) * tl.exp(j.to(tl.float32) * (-1.0 / STEP))
        past = tl.sum(ceiling, axis=0) - tl.cumsum(ceiling, axis=0)
        ends = (j < BUCKETS - 1) & (run >= 1) & (tl.where(k_on, run >= top_k, False) |
                                                 tl.where(p_on, total - past >= top_p * total, False) | (run == V))
        end = tl.min(tl.where(ends, j, BUCKETS), axis=0)
        listed = tl.sum(tl.where(j <= end, counts, 0), axis=0)
        if (end < BUCKETS) & (listed <= CAP):
            last = end
            size = listed
    tl.store(last_ptr + row, last)
    tl.store(size_ptr + row, size)
    tl.store(fill_ptr + row, 0)


@triton.jit
def _gather_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, last_ptr, fill_ptr, list_ptr, V,
                   C, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CP: tl.constexpr, SUB: tl.constexpr,
                   STEP: tl.constexpr, BUCKETS: tl.constexpr, CAP: tl.constexpr):
    p = tl.program_id(0)
    row = tl.program_id(1)
    last = tl.load(last_ptr + row)
    if last >= 0:
        inverse = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)[1]
        ref, _, _ = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        base = x_ptr + row.to(tl.int64) * stride
        out = list_ptr + row.to(tl.int64) * CAP
        first = p * CHUNKS * BLOCK
        for start in range(first, first + CHUNKS * BLOCK, SUB):
            ids = start + tl.arange(0, SUB)
            s, valid = scaled_chunk(base, ids, V, inverse)
            take = valid & (_bucket(s, ref, STEP, BUCKETS) <= last)
            # A slot per listed token (a short list: few atomics, where a scan of the tile cost
            # more than its load).
            at = tl.atomic_add(fill_ptr + row + tl.zeros([SUB], tl.int32), 1, mask=take)
            # (the counts bound the slots below the list's size <= CAP; the mask only guards memory)
            tl.store(out + at, _entry(order_key(s), ids), mask=take & (at < CAP))


@triton.jit
def _rank(list_ptr, size, ref, needed, top_k, k_on, p_on, WIDTH: tl.constexpr):
    """Sort a row's list of `size` <= WIDTH entries into rank order, in place. Returns the kept
    count (past `size` if the list ends first) and the kept set's last key and id."""
    i = tl.arange(0, WIDTH)
    ranked = tl.sort(tl.load(list_ptr + i, mask=i < size, other=_LAST))
    key, ids = _key_and_id(ranked)
    e = tl.where(i < size, tl.exp(from_order_key(key) - ref), 0.0)
    # After rank i the set has i + 1 tokens and mass through i: the reference's test on rank i + 1.
    stops = (i < size) & (tl.where(k_on, i + 1 >= top_k, False) | tl.where(p_on, tl.cumsum(e, axis=0) >= needed, False))
    kept = tl.min(tl.where(stops, i, WIDTH), axis=0) + 1
    tl.store(list_ptr + i, ranked, mask=i < size)
    return kept, tl.sum(tl.where(i == kept - 1, key, 0), axis=0), tl.sum(tl.where(i == kept - 1, ids, 0), axis=0)


@triton.jit
def _walk(list_ptr, kept, ref, u, V, WIDTH: tl.constexpr):
    """The token drawn at u from the first `kept` <= WIDTH entries of a ranked list: their CDF
    walked in id order, as the pick walks an unfiltered row."""
    i = tl.arange(0, WIDTH)
    key, ids = _key_and_id(tl.load(list_ptr + i, mask=i < kept, other=_LAST))
    # The same two halves swapped: ascending order is id order.
    by_id = tl.sort(tl.where(i < kept, (ids.to(tl.int64) << 32) | (key.to(tl.int64) & 0xFFFFFFFF), _LAST))
    ids = (by_id >> 32).to(tl.int32)
    w = tl.where(i < kept, tl.exp(from_order_key((by_id & 0xFFFFFFFF).to(tl.int32)) - ref), 0.0)
    running = tl.cumsum(w, axis=0)
    return crossing(running, w, ids, u * tl.max(running, axis=0), V)


@triton.jit
def _settle_kernel(seed_ptr, step_ptr, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, list_ptr, size_ptr, out_ptr,
                   bound_ptr, settled_ptr, V, C, CP: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr):
    row = tl.program_id(0)
    greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    settled = tl.full([], 0, tl.int32)
    size = tl.load(size_ptr + row)
    if (k_on | p_on) & (size >= 0):
        ref, _, total = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        entries = list_ptr + row.to(tl.int64) * CAP
        # Each sort's width depends on the row alone (its list's size, its kept count).
        if size <= SMALL:
            kept, threshold, cut = _rank(entries, size, ref, top_p * total, top_k, k_on, p_on, SMALL)
        else:
            kept, threshold, cut = _rank(entries, size, ref, top_p * total, top_k, k_on, p_on, CAP)
        if kept <= size:
            settled = tl.full([], 1, tl.int32)
            tl.debug_barrier()  # the ranked list is stored before any thread reads it back
            u = row_uniform(tl.load(seed_ptr + row), tl.load(step_ptr + row))
            if kept <= SMALL:
                token = _walk(entries, kept, ref, u, V, SMALL)
            else:
                token = _walk(entries, kept, ref, u, V, CAP)
            tl.store(out_ptr + row, token.to(tl.int64))
            tl.store(bound_ptr + row * 2, threshold)
            tl.store(bound_ptr + row * 2 + 1, cut)
    tl.store(settled_ptr + row, settled)


def settle(x: torch.Tensor, seeds, steps, params, m, z, out, bound, block: int, per_program: int,
           chunks_p2: int) -> torch.Tensor:
    """For the rows that filter and fit a short list: the token in `out`, t and the cut in `bound`.
    Returns int32 [B], 1 where a row was settled here (the others are left to the radix select)."""
    batch, vocab = x.shape
    chunks = m.shape[1]
    parts = triton.cdiv(chunks, per_program)
    hist = torch.empty((batch, parts, _BUCKETS), dtype=torch.int32, device=x.device)
    last = torch.empty(batch, dtype=torch.int32, device=x.device)
    size = torch.empty_like(last)
    fill = torch.empty_like(last)
    entries = torch.empty((batch, _CAP), dtype=torch.int64, device=x.device)
    settled = torch.empty_like(last)
    shape = dict(BLOCK=block, CHUNKS=per_program, CP=chunks_p2, STEP=_STEP, BUCKETS=_BUCKETS, num_warps=_WARPS)
    _histogram_kernel[(parts, batch)](x, x.stride(0), *params, m, z, hist, vocab, chunks, parts,
                                      SUB=min(_HISTOGRAM_TILE, per_program * block), **shape)
    _choose_kernel[(batch,)](*params, m, z, hist, last, size, fill, vocab, chunks, parts, CP=chunks_p2,
                             PP=max(2, triton.next_power_of_2(parts)), STEP=_STEP, BUCKETS=_BUCKETS, CAP=_CAP,
                             num_warps=_WARPS)
    _gather_kernel[(parts, batch)](x, x.stride(0), *params, m, z, last, fill, entries, vocab, chunks, CAP=_CAP,
                                   SUB=min(_GATHER_TILE, per_program * block), **shape)
    _settle_kernel[(batch,)](seeds, steps, *params, m, z, entries, size, out, bound, settled, vocab, chunks,
                             CP=chunks_p2, CAP=_CAP, SMALL=min(_SMALL, _CAP), num_warps=_WARPS,
                             enable_fp_fusion=False)
    return settled
