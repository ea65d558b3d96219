"""Top-k / top-p from a short candidate list: the common case, four launches.

A kept set is a prefix of the rank order (score descending, ties by lowest id), and
real rows keep few tokens. So:
  1. histogram: one program per part of a row (_CHUNKS chunks) counts its tokens by
     how far below the row max their score lies, in buckets of 1 / _STEP; the last
     bucket takes the rest (and the padding past V). It also keeps each tile of _TILE
     tokens' shallowest bucket.
  2. choose: one program per row merges the counts and finds the first bucket by
     which the kept set has provably ended: top-k's count reached, top-p's mass
     reached (the buckets past it hold at most their counts times the exp of their
     near edges), or the whole row counted. The tokens up to it are a prefix of the rank
     order with its ties whole: the row's list. Each part's count in it gives the part
     its first slot.
  3. gather: one program per part reads only the tiles whose shallowest bucket the list
     reaches, and writes their listed tokens as (rank key, id), each in a slot from the
     part's own counter, which the choose started at the part's first slot.
  4. settle: one program per row finds the kept set and draws from it with integer sums
     only: each listed token's mass exp(s - max) in fixed point, packed with a count of
     one. A short list is sorted (by rank, then the kept set by id) and summed running;
     a long one is searched by bisection (boundary key, cut among its ties, drawn id),
     a step being one masked sum. Integer sums are exact in any order, so both give one
     answer, and the list's order and width move no bit.
A row whose list would pass _CAP tokens, or whose list ends before the kept set does
(masses the bound cannot see, -inf tails under top-k), is left to
kernels/sampling_filter.py's radix select, through a work list of such rows. Which
path a row takes, and every sum on it, depend on that row alone.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import cdiv, launch, next_power_of_2
from kernels.philox import row_uniform
from kernels.sampling_rows import from_order_key, load_partials, merged_mass, order_key, row_params, scaled_chunk
from kernels.toolchain import FP_FUSION

# _STEP and _BUCKETS choose which rows take this path, and so (by rounding) which path's
# sums settle a row: buckets of 1/2 of a unit of scaled score, 16 units deep. 32 bins cost
# the histogram's ballots a third of 128's; the lists grow by under a bucket's tokens.
# _CAP bounds a list (and the rows it settles); _FRACTION fixes the fixed point of the
# settle's masses. Changing any of these moves KERNEL_VERSION. _SMALL and the tiles only
# size registers and loops.
_STEP = 2
_BUCKETS = 32
_CAP = 4096
_SMALL = 256
_HISTOGRAM_TILE = 8192
# The histogram keeps each _TILE tokens' shallowest bucket; the gather reads only the tiles
# its list reaches, _ROUND of them at once (H100, B >= 32: 4 faster than 8 or 16; at B = 1, 8
# by ~1 us). Only timing depends on them.
_TILE = 256
_ROUND = 4
_WARPS = 8
_LAST = tl.constexpr(2**63 - 1)
# A listed token's settle term: 1 << _COUNT_AT plus its mass exp(s - max) <= 1 times 2**_FRACTION,
# truncated. _CAP such terms sum below 2**63 with the masses below the count.
_FRACTION = 36
_SCALE = tl.constexpr(float(2**_FRACTION))
_COUNT_AT = tl.constexpr(50)
_MASS = tl.constexpr(2**50 - 1)


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
def _histogram_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, hist_ptr, tile_ptr, V, C, P,
                      BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CP: tl.constexpr, SUB: tl.constexpr,
                      TILE: tl.constexpr, STEP: tl.constexpr, BUCKETS: tl.constexpr):
    p = tl.program_id(0)
    row = tl.program_id(1)
    greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    if k_on | p_on:
        ref, _, _ = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        base = x_ptr + row.to(tl.int64) * stride
        counts = tl.zeros([BUCKETS], tl.int32)
        first = p * CHUNKS * BLOCK
        t = tl.arange(0, SUB // TILE)
        for start in range(first, first + CHUNKS * BLOCK, SUB):
            bucket = _bucket(scaled_chunk(base, start + tl.arange(0, SUB), V, inverse)[0], ref, STEP, BUCKETS)
            # Each tile's shallowest bucket: the gather reads only the tiles that reach its list.
            shallowest = tl.min(tl.reshape(bucket, [SUB // TILE, TILE]), axis=1)
            tl.store(tile_ptr + row * P * (CHUNKS * BLOCK // TILE) + start // TILE + t, shallowest)
            # Only the listable buckets are binned; the last is the part's remainder. Where the
            # histogram is shared-memory atomics (Triton 3.9) most tokens would hit its one
            # counter; where it is ballots (3.6, measured) its cost grows with the bins instead.
            if tl.min(shallowest, axis=0) < BUCKETS - 1:
                counts += tl.histogram(bucket, BUCKETS, mask=bucket < BUCKETS - 1)
        # The last bucket: the part's other tokens, and its padding past V (scored -inf).
        j = tl.arange(0, BUCKETS)
        counts = tl.where(j == BUCKETS - 1, CHUNKS * BLOCK - tl.sum(counts, axis=0), counts)
        tl.store(hist_ptr + (row * P + p) * BUCKETS + j, counts)


@triton.jit
def _choose_kernel(temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, hist_ptr, last_ptr, size_ptr, next_ptr, work_ptr, V,
                   C, P, CP: tl.constexpr, PP: tl.constexpr, STEP: tl.constexpr, BUCKETS: tl.constexpr,
                   CAP: tl.constexpr):
    """Per row: the last bucket of the list (-1: no list), its size and each part's first slot in it."""
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
            in_part = tl.sum(tl.where(j[None, :] <= end, hist, 0), axis=1)
            tl.store(next_ptr + row * P + parts, tl.cumsum(in_part, axis=0) - in_part, mask=parts < P)
    tl.store(last_ptr + row, last)
    tl.store(size_ptr + row, size)
    if row == 0:
        tl.store(work_ptr, 0)  # the settle counts the rows it leaves to the radix select from here


@triton.jit
def _gather_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, last_ptr, next_ptr, tile_ptr,
                   list_ptr, V, C, P, PART: tl.constexpr, CP: tl.constexpr, TILE: tl.constexpr,
                   ROUND: tl.constexpr, STEP: tl.constexpr, BUCKETS: tl.constexpr, CAP: tl.constexpr):
    p = tl.program_id(0)
    row = tl.program_id(1)
    last = tl.load(last_ptr + row)
    if last >= 0:
        inverse = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)[1]
        ref, _, _ = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        base = x_ptr + row.to(tl.int64) * stride
        out = list_ptr + row.to(tl.int64) * CAP
        # The part's tiles that its list reaches (by the histogram's shallowest buckets), each
        # numbered by its rank among them; the others are never read.
        t = p * (PART // TILE) + tl.arange(0, PART // TILE)
        reached = tl.load(tile_ptr + row * P * (PART // TILE) + t) <= last
        rank = tl.where(reached, tl.cumsum(reached.to(tl.int32), axis=0) - 1, -1)
        k = tl.arange(0, ROUND)
        for first in range(0, tl.sum(reached.to(tl.int32), axis=0), ROUND):
            # The tiles ranked first .. first + ROUND - 1, read at once.
            hit = rank[None, :] == first + k[:, None]
            tile = tl.sum(tl.where(hit, t[None, :], 0), axis=1)
            ids = tl.where((tl.max(hit.to(tl.int32), axis=1) > 0)[:, None], tile[:, None] * TILE + tl.arange(0, TILE)[None, :], V)
            s, valid = scaled_chunk(base, ids, V, inverse)
            take = valid & (_bucket(s, ref, STEP, BUCKETS) <= last)
            # A slot per listed token from the part's own counter, which starts at the part's
            # first slot: no barrier per tile (a scan of each tile measured 15-25% slower).
            at = tl.atomic_add(next_ptr + row * P + p + tl.zeros(ids.shape, tl.int32), 1, mask=take, sem="relaxed")
            # (the counts keep slots below the list's size <= CAP; the mask only guards memory)
            tl.store(out + at, _entry(order_key(s), ids), mask=take & (at < CAP))


@triton.jit
def _meets(packed, top_k, needed, k_on, p_on):
    """Whether a set (its packed count and mass) meets an active condition, never when empty."""
    count = packed >> _COUNT_AT
    return (count >= 1) & (tl.where(k_on, count >= top_k, False) | tl.where(p_on, (packed & _MASS) >= needed, False))


@triton.jit
def _terms(key, listed, ref):
    """A token's settle term, int64: 1 << _COUNT_AT (it counts one) plus exp(s - ref) in fixed point."""
    mass = (tl.where(listed, tl.exp(from_order_key(key) - ref), 0.0) * _SCALE).to(tl.int64)
    return tl.where(listed, (tl.full(mass.shape, 1, tl.int64) << _COUNT_AT) + mass, 0), mass


@triton.jit
def _target(u, total):
    # floor(u * total) exactly: u has 24 bits. Below total whenever total > 0.
    scaled_u = (u * 16777216.0).to(tl.int64)
    return scaled_u * (total >> 24) + ((scaled_u * (total & 0xFFFFFF)) >> 24)


@triton.jit
def _settle_sorted(entries, size, ref, needed, top_k, k_on, p_on, u, V, WIDTH: tl.constexpr):
    """(settled, boundary key, cut id, token) from a short list: sorted into rank order, the
    kept set is the shortest prefix whose running term meets a condition; sorted by id, the
    token is the first whose running mass passes the target. Integer running sums: exact,
    so the same answer as _settle_searched's."""
    i = tl.arange(0, WIDTH)
    listed = i < size
    ranked = tl.sort(tl.load(entries + i, mask=listed, other=_LAST))
    key, ids = _key_and_id(ranked)
    term = _terms(key, listed, ref)[0]
    stops = listed & _meets(tl.cumsum(term, axis=0), top_k, needed, k_on, p_on)
    kept = tl.min(tl.where(stops, i, WIDTH), axis=0) + 1
    threshold = tl.sum(tl.where(i == kept - 1, key, 0), axis=0)
    cut = tl.sum(tl.where(i == kept - 1, ids, 0), axis=0)
    # The kept ranks again, in id order (the two halves of an entry swapped).
    by_id = tl.sort(tl.where(i < kept, (ids.to(tl.int64) << 32) | (key.to(tl.int64) & 0xFFFFFFFF), _LAST))
    ids = (by_id >> 32).to(tl.int32)
    weight = _terms((by_id & 0xFFFFFFFF).to(tl.int32), i < kept, ref)[1]
    running = tl.cumsum(weight, axis=0)
    token = tl.min(tl.where((running > _target(u, tl.sum(weight, axis=0))) & (weight > 0), ids, V), axis=0)
    return (kept <= size).to(tl.int32), threshold, cut, tl.where(token == V, 0, token)


@triton.jit
def _settle_searched(entries, size, ref, needed, top_k, k_on, p_on, u, V, WIDTH: tl.constexpr):
    """As _settle_sorted, for a list too long to sort cheaply: the boundary key, the cut among
    its ties and the token are each found by bisection, a step being one masked sum."""
    i = tl.arange(0, WIDTH)
    listed = i < size
    key, ids = _key_and_id(tl.load(entries + i, mask=listed, other=_LAST))
    term, mass = _terms(key, listed, ref)
    settled = _meets(tl.sum(term, axis=0), top_k, needed, k_on, p_on).to(tl.int32)
    threshold = tl.full([], 0, tl.int32)
    cut = tl.full([], 0, tl.int32)
    token = tl.full([], 0, tl.int32)
    if settled:
        # The boundary t: the highest key whose set {key >= t} meets a condition (lo does, hi not).
        lo = tl.min(tl.where(listed, key, 2147483647), axis=0).to(tl.int64)
        hi = tl.max(tl.where(listed, key, -2147483648), axis=0).to(tl.int64) + 1
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            if _meets(tl.sum(tl.where(key >= mid, term, 0), axis=0), top_k, needed, k_on, p_on):
                lo = mid
            else:
                hi = mid
        threshold = lo.to(tl.int32)
        above = tl.sum(tl.where(key > threshold, term, 0), axis=0)
        tie = listed & (key == threshold)
        ties = tl.sum(tl.where(tie, term, 0), axis=0)
        count = ties >> _COUNT_AT
        each = (ties & _MASS) // count  # ties share a score, so a mass
        # Ties are kept in id order while the set before them misses every condition.
        short = tl.maximum(needed - (above & _MASS), 0)
        by_p = tl.where(short == 0, 0, tl.where(each > 0, (short + each - 1) // tl.maximum(each, 1), count))
        keep = tl.maximum(tl.minimum(tl.where(k_on, top_k - (above >> _COUNT_AT), count),
                                     tl.where(p_on, by_p, count)), 1)
        keep = tl.minimum(keep, count)
        # The cut: the keep-th lowest id among the ties (lo has fewer, hi enough).
        lo = tl.full([], -1, tl.int64)
        hi = tl.max(tl.where(tie, ids, -1), axis=0).to(tl.int64)
        while (hi - lo > 1) & (keep < count):
            mid = lo + (hi - lo) // 2
            if tl.sum((tie & (ids <= mid)).to(tl.int32), axis=0) >= keep:
                hi = mid
            else:
                lo = mid
        cut = hi.to(tl.int32)
        # The token: the first kept id whose running mass passes the target (lo's is 0, hi's
        # the total; a kept set without mass draws token 0).
        weight = tl.where(listed & ((key > threshold) | (tie & (ids <= cut))), mass, 0)
        target = _target(u, tl.sum(weight, axis=0))
        lo = tl.full([], -1, tl.int64)
        hi = tl.max(tl.where(weight > 0, ids, -1), axis=0).to(tl.int64)
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            if tl.sum(tl.where(ids <= mid, weight, 0), axis=0) > target:
                hi = mid
            else:
                lo = mid
        token = tl.maximum(hi, 0).to(tl.int32)
    return settled, threshold, cut, token


@triton.jit
def _settle_kernel(seed_ptr, step_ptr, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, list_ptr, size_ptr, out_ptr,
                   bound_ptr, settled_ptr, work_ptr, V, C, CP: tl.constexpr, CAP: tl.constexpr,
                   SMALL: tl.constexpr):
    row = tl.program_id(0)
    greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    settled = tl.full([], 0, tl.int32)
    size = tl.load(size_ptr + row)
    if (k_on | p_on) & (size >= 0):
        ref, _, total = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        # top_p * total as the radix select takes it, scaled to the fixed point exactly (a power of two)
        needed = ((top_p * total) * _SCALE).to(tl.int64)
        u = row_uniform(tl.load(seed_ptr + row), tl.load(step_ptr + row))
        entries = list_ptr + row.to(tl.int64) * CAP
        # Sorting is the faster of the two on short lists; integer sums give both one answer.
        if size <= SMALL:
            settled, threshold, cut, token = _settle_sorted(entries, size, ref, needed, top_k, k_on, p_on, u, V, SMALL)
        else:
            settled, threshold, cut, token = _settle_searched(entries, size, ref, needed, top_k, k_on, p_on, u, V, CAP)
        if settled:
            tl.store(out_ptr + row, token.to(tl.int64))
            tl.store(bound_ptr + row * 2, threshold)
            tl.store(bound_ptr + row * 2 + 1, cut)
    tl.store(settled_ptr + row, settled)
    if (k_on | p_on) & (settled == 0):
        # The radix select's work list: its programs take these rows alone.
        tl.store(work_ptr + 1 + tl.atomic_add(work_ptr, 1, sem="relaxed"), row)


def settle(x: torch.Tensor, seeds, steps, params, m, z, out, bound, block: int, per_program: int,
           chunks_p2: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For the rows that filter and fit a short list: the token in `out`, t and the cut in `bound`.
    Returns (settled, work): int32 [B], 1 where a row was settled here; int32 [1 + B], the
    count of rows left to the radix select, then those rows (in no fixed order)."""
    batch, vocab = x.shape
    chunks = m.shape[1]
    parts = cdiv(chunks, per_program)
    hist = torch.empty((batch, parts, _BUCKETS), dtype=torch.int32, device=x.device)
    part = per_program * block
    sub = min(_HISTOGRAM_TILE, part)
    tile = min(_TILE, sub)
    shallowest = torch.empty((batch, parts * (part // tile)), dtype=torch.int32, device=x.device)
    last = torch.empty(batch, dtype=torch.int32, device=x.device)
    size = torch.empty_like(last)
    next_slot = torch.empty((batch, parts), dtype=torch.int32, device=x.device)
    entries = torch.empty((batch, _CAP), dtype=torch.int64, device=x.device)
    settled = torch.empty_like(last)
    work = torch.empty(1 + batch, dtype=torch.int32, device=x.device)
    shape = dict(CP=chunks_p2, STEP=_STEP, BUCKETS=_BUCKETS, num_warps=_WARPS, enable_fp_fusion=FP_FUSION)
    launch(_histogram_kernel, (parts, batch), x, x.stride(0), *params, m, z, hist, shallowest, vocab, chunks, parts,
           BLOCK=block, CHUNKS=per_program, SUB=sub, TILE=tile, **shape)
    launch(_choose_kernel, (batch,), *params, m, z, hist, last, size, next_slot, work, vocab, chunks, parts,
           CP=chunks_p2, PP=max(2, next_power_of_2(parts)), STEP=_STEP, BUCKETS=_BUCKETS, CAP=_CAP,
           num_warps=_WARPS, enable_fp_fusion=FP_FUSION)
    launch(_gather_kernel, (parts, batch), x, x.stride(0), *params, m, z, last, next_slot, shallowest, entries,
           vocab, chunks, parts, PART=part, TILE=tile, ROUND=_ROUND, CAP=_CAP, **shape)
    launch(_settle_kernel, (batch,), seeds, steps, *params, m, z, entries, size, out, bound, settled, work, vocab,
           chunks, CP=chunks_p2, CAP=_CAP, SMALL=min(_SMALL, _CAP), num_warps=_WARPS, enable_fp_fusion=False)
    return settled, work
