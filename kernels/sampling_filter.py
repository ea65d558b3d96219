"""Top-k / top-p kept sets, spread over many programs per row: a radix select, for the
rows that kernels/sampling_candidates.py leaves unsettled (long kept sets, ties past
its list, -inf tails). Those rows come as a work list, a program taking up to _ROWS
of them. The whole select is one launch whose programs wait on the round before theirs
(_select_kernel); with nothing listed, every program returns at once.

A filtered row keeps {key > t} and the first ties at t in id order (the rule in
kernels/sampling.py's docstring), where key is the order-preserving int32 image of
the fp32 score. t is found _BITS bits at a time, most significant first, in
32 / _BITS rounds. In each, one program per part of the row (the chunks one pass-1
program takes) bins the part's tokens that share the digits chosen so far by their
next digit, counting them and summing their masses exp(s - row max). The next
round's programs all merge those per-part bins the same way (counts are integers;
masses fp32, summed over the parts in one fixed tree, then running down the bins
from the highest digit) and so all descend into the same digit: the highest whose
set {key >= prefix.digit.0...} meets an active condition. A last round ranks the
ties at t and writes each chunk's (max, mass) over its kept tokens in place of pass
1's partials, so the pick inverts the kept CDF exactly as it does for an unfiltered
row.

A program waits only for its rows' previous round, and nothing is shared between rows:
the order of every sum is fixed by V, the chunk size, the chunks per part, _BITS and _SUB. Once
the running set has left a part (its count in the chosen bin is 0), the part's
programs skip the load.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import cdiv, launch, next_power_of_2
from kernels.sampling_rows import (chunk_mass, from_order_key, load_partials, merged_mass, order_key, release,
                                   row_params, scaled_chunk, wait_for)

# _BITS and _SUB fix how the top-p masses are grouped into sums, so changing either
# can move a kept set's boundary by rounding and KERNEL_VERSION must move with it.
# 4 bits: 16 bins and 8 rounds per call. _SUB tokens per one-hot tile: each
# thread holds SUB * BINS / (32 * _WARPS) of each accumulator.
_BITS = 4
_SUB = 512
_WARPS = 8
_SIGN = tl.constexpr(-2147483648)
# Work-list rows a round's programs take at once (with their part); a program takes rows
# w, w + that, ... (at most _ROWS, unrolled: a loop instead doubled the registers). A grid
# that fills the GPU when every row is listed and costs little when none is (H100, B = 256,
# nothing listed: 18 us for the one launch, 25 when each round was a launch, 81 when every
# (row, part) had a program that checked its row's flag). Only timing depends on them.
_LISTED = 64
_ROWS = 4


@triton.jit
def _state(r, row, p, P, C, m_ptr, z_ptr, top_p, k_on, top_k, p_on, count_ptr, mass_ptr, state_i_ptr, state_f_ptr,
           part_ptr, B, PP: tl.constexpr, CP: tl.constexpr, BINS: tl.constexpr, BITS: tl.constexpr):
    """The row's running set before round r's digit: (prefix, above count, above mass, row max,
    needed mass), and part p's count above the prefix and with it. Every program of the row
    computes the same values; part 0 keeps them for the next round."""
    if r == 0:
        row_max, _, total = merged_mass(*load_partials(m_ptr + row * C, z_ptr + row * C, C, CP))
        needed = top_p * total
        prefix = tl.full([], 0, tl.int32)
        above_count = tl.full([], 0, tl.int32)
        above_mass = tl.full([], 0.0, tl.float32)
        part_above = tl.full([], 0, tl.int32)
        part_left = tl.full([], 1, tl.int32)
        if p == 0:
            tl.store(state_f_ptr + row * 4 + 2, row_max)
            tl.store(state_f_ptr + row * 4 + 3, needed)
    else:
        # Merge the row's per-part bins of round r - 1 (bin 0 = its highest digit) and
        # descend into the highest bin whose running set meets an active condition.
        row_max = tl.load(state_f_ptr + row * 4 + 2)
        needed = tl.load(state_f_ptr + row * 4 + 3)
        slot = (r - 1) % 2
        prefix = tl.load(state_i_ptr + (slot * B + row) * 2)
        part_bins = count_ptr + (slot * B + row) * P * BINS
        i = tl.arange(0, PP)[:, None]
        j = tl.arange(0, BINS)
        mine = tl.load(part_bins + p * BINS + j)
        counts = tl.sum(tl.load(part_bins + i * BINS + j[None, :], mask=i < P, other=0), axis=0)
        masses = tl.sum(tl.load(mass_ptr + (slot * B + row) * P * BINS + i * BINS + j[None, :], mask=i < P,
                                other=0.0), axis=0)
        run_count = tl.load(state_i_ptr + (slot * B + row) * 2 + 1) + tl.cumsum(counts, axis=0)
        run_mass = tl.load(state_f_ptr + row * 4 + slot) + tl.cumsum(masses, axis=0)
        # tl.where rather than scalar & block: the interpreter mis-types that mix.
        meets = (run_count >= 1) & (tl.where(k_on, run_count >= top_k, False) |
                                    tl.where(p_on, run_mass >= needed, False))
        # The first bin that meets; if none does (rounding can leave the whole row's mass
        # short of top_p * Z), keep everything: the last bin with tokens. One min for both.
        pick = tl.min(tl.where(meets, j, tl.where(counts > 0, 2 * BINS - j, 2 * BINS)), axis=0)
        pick = tl.where(pick < BINS, pick, 2 * BINS - pick)
        above_count = tl.sum(tl.where(j == pick, run_count - counts, 0), axis=0)
        # The running sum the test used: the set above the pick is the set that missed.
        above_mass = tl.where(pick == 0, tl.load(state_f_ptr + row * 4 + slot),
                              tl.sum(tl.where(j == pick - 1, run_mass, 0.0), axis=0))
        prefix = prefix | ((BINS - 1 - pick) << (32 - BITS * r))
        part_above = tl.load(part_ptr + row * P + p) + tl.sum(tl.where(j < pick, mine, 0), axis=0)
        part_left = tl.load(part_bins + p * BINS + pick)
    if p == 0:
        tl.store(state_i_ptr + ((r % 2) * B + row) * 2, prefix)
        tl.store(state_i_ptr + ((r % 2) * B + row) * 2 + 1, above_count)
        tl.store(state_f_ptr + row * 4 + r % 2, above_mass)
    tl.store(part_ptr + row * P + p, part_above)
    return prefix, above_count, above_mass, row_max, needed, part_above, part_left


@triton.jit
def _work_row(work_ptr, w, W, k):
    """Row group w's k-th row of the work list (a count, then row ids): (whether it exists, the row)."""
    at = w + k * W
    listed = at < tl.load(work_ptr)
    return listed, tl.load(work_ptr + 1 + at, mask=listed, other=0)


@triton.jit
def _round(r, p, w, W, x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, work_ptr, count_ptr, mass_ptr,
           state_i_ptr, state_f_ptr, part_ptr, V, C, P, B, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
           SUB: tl.constexpr, CP: tl.constexpr, PP: tl.constexpr, BINS: tl.constexpr, BITS: tl.constexpr,
           ROWS: tl.constexpr):
    """Round r: bin part p's (CHUNKS chunks') tokens of the running set by their digit r
    (bits 31 - BITS*r down), for row group w's rows."""
    for k in tl.static_range(ROWS):
        listed, row = _work_row(work_ptr, w, W, k)
        if listed:
            greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
            prefix, _, _, row_max, _, _, part_left = _state(
                r, row, p, P, C, m_ptr, z_ptr, top_p, k_on, top_k, p_on, count_ptr, mass_ptr, state_i_ptr, state_f_ptr,
                part_ptr, B, PP, CP, BINS, BITS)
            j = tl.arange(0, BINS)
            q = tl.arange(0, BINS // 4)
            # Counts packed four bins to an int32, a byte each (SUB-token steps per part < 256):
            # a token adds 1 << 8 * (bin % 4) to word bin // 4. Masses in a one-hot [SUB, BINS]
            # tile. Both summed over tokens per lane, across lanes once per part at the end.
            packed = tl.full([SUB, BINS // 4], 0, tl.int32)
            masses = tl.full([SUB, BINS], 0.0, tl.float32)
            if part_left > 0:
                shift = 32 - BITS * (r + 1)
                # The digits chosen so far are the top BITS*r bits (none in round 0; the clamp only
                # keeps that round's discarded shift in range).
                high = tl.where(r == 0, 0, tl.full([], -1, tl.int32) << tl.minimum(shift + BITS, 31))
                base = x_ptr + row.to(tl.int64) * stride
                first = p * CHUNKS * BLOCK
                for start in range(first, tl.minimum(first + CHUNKS * BLOCK, V), SUB):
                    s, valid = scaled_chunk(base, start + tl.arange(0, SUB)[:, None], V, inverse)
                    # Flipping the sign bit makes the keys' unsigned order their signed order.
                    key = order_key(s) ^ _SIGN
                    into = tl.where(valid & ((key & high) == prefix), BINS - 1 - ((key >> shift) & (BINS - 1)), BINS)
                    packed += tl.where((into >> 2) == q[None, :], tl.full([SUB, 1], 1, tl.int32) << ((into & 3) * 8), 0)
                    # Top-k alone needs only the counts; the exp and the sums are most of a round.
                    if p_on:
                        masses += tl.where(into == j[None, :], tl.exp(s - row_max), 0.0)
            byte = tl.arange(0, 4)
            counts = tl.sum((packed[:, :, None] >> (byte[None, None, :] * 8)) & 255, axis=0)
            at = ((r % 2) * B + row) * P * BINS + p * BINS + j
            tl.store(count_ptr + at, tl.reshape(counts, [BINS]))
            tl.store(mass_ptr + at, tl.sum(masses, axis=0))


@triton.jit
def _kept(p, w, W, x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, work_ptr, where_ptr, bound_ptr,
          count_ptr, mass_ptr, state_i_ptr, state_f_ptr, part_ptr, V, C, P, B, BLOCK: tl.constexpr,
          CHUNKS: tl.constexpr, CP: tl.constexpr, PP: tl.constexpr, BINS: tl.constexpr, BITS: tl.constexpr,
          ROUNDS: tl.constexpr, ROWS: tl.constexpr):
    """After the last round: t, how many ties at t are kept, and per chunk of part p the kept
    tokens' (max, mass) over pass 1's partials and the highest kept tie id (in where_ptr)."""
    for k in tl.static_range(ROWS):
        listed, row = _work_row(work_ptr, w, W, k)
        if listed:
            greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
            prefix, above_count, above_mass, row_max, needed, part_above, part_ties = _state(
                ROUNDS, row, p, P, C, m_ptr, z_ptr, top_p, k_on, top_k, p_on, count_ptr, mass_ptr, state_i_ptr,
                state_f_ptr, part_ptr, B, PP, CP, BINS, BITS)
            threshold = prefix ^ _SIGN
            # Tie rank r is kept while the set before it still misses every active condition.
            # That test only grows with r, so the kept ties are ranks [0, keep): bisect for keep.
            tie_weight = tl.exp(from_order_key(threshold) - row_max)
            pick = (BINS - 1) - (prefix & (BINS - 1))
            i = tl.arange(0, PP)
            tie_counts = tl.load(count_ptr + ((((ROUNDS - 1) % 2) * B + row) * P + i) * BINS + pick, mask=i < P,
                                 other=0)
            lo = tl.full([], 0, tl.int32)
            hi = tl.sum(tie_counts, axis=0)
            while lo < hi:
                mid = (lo + hi) // 2
                prior = above_count + mid
                full = (prior >= 1) & ((k_on & (prior >= top_k)) |
                                       (p_on & (above_mass + mid.to(tl.float32) * tie_weight >= needed)))
                if full:
                    hi = mid
                else:
                    lo = mid + 1
            keep = lo
            seen = tl.sum(tl.where(i < p, tie_counts, 0), axis=0)
            wanted = part_above + tl.minimum(tl.maximum(keep - seen, 0), part_ties)
            base = x_ptr + row.to(tl.int64) * stride
            for c in range(p * CHUNKS, tl.minimum(p * CHUNKS + CHUNKS, C)):
                top = tl.full([], float("-inf"), tl.float32)
                mass = tl.full([], 0.0, tl.float32)
                cut = tl.full([], -1, tl.int32)
                if wanted > 0:
                    ids = c * BLOCK + tl.arange(0, BLOCK)
                    s, valid = scaled_chunk(base, ids, V, inverse)
                    key = order_key(s)
                    tie = valid & (key == threshold)
                    rank = seen + tl.cumsum(tie.to(tl.int32), axis=0) - 1
                    seen += tl.sum(tie.to(tl.int32), axis=0)
                    kept_tie = tie & (rank < keep)
                    top, mass = chunk_mass(tl.where((valid & (key > threshold)) | kept_tie, s, float("-inf")))
                    cut = tl.max(tl.where(kept_tie, ids, -1), axis=0)
                tl.store(m_ptr + row * C + c, top)
                tl.store(z_ptr + row * C + c, mass)
                tl.store(where_ptr + row * C + c, cut)
            if p == 0:
                tl.store(bound_ptr + row * 2, threshold)


@triton.jit(do_not_specialize=["W"])
def _select_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, work_ptr, where_ptr, bound_ptr,
                   count_ptr, mass_ptr, state_i_ptr, state_f_ptr, part_ptr, done_ptr, V, C, P, B, W,
                   BLOCK: tl.constexpr, CHUNKS: tl.constexpr, SUB: tl.constexpr, CP: tl.constexpr,
                   PP: tl.constexpr, BINS: tl.constexpr, BITS: tl.constexpr, ROUNDS: tl.constexpr,
                   ROWS: tl.constexpr):
    """Every round and the kept partials in one launch. Program ids run round by round, row
    group by row group, part by part, so the parts of a row group's previous round, which a
    program waits for, all have lower ids (sampling_rows.wait_for). A row group with no listed
    row returns at once: an empty work list costs one launch of returning programs, not one
    per round."""
    step = tl.program_id(0) // P
    p = tl.program_id(0) % P
    r = step // W
    w = step % W
    if w < tl.load(work_ptr):
        if r > 0:
            wait_for(done_ptr + (r - 1) * W + w, P)
        if r < ROUNDS:
            _round(r, p, w, W, x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, work_ptr, count_ptr,
                   mass_ptr, state_i_ptr, state_f_ptr, part_ptr, V, C, P, B, BLOCK, CHUNKS, SUB, CP, PP, BINS, BITS,
                   ROWS)
            release(done_ptr + r * W + w)
        else:
            _kept(p, w, W, x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, work_ptr, where_ptr,
                  bound_ptr, count_ptr, mass_ptr, state_i_ptr, state_f_ptr, part_ptr, V, C, P, B, BLOCK, CHUNKS, CP,
                  PP, BINS, BITS, ROUNDS, ROWS)


def kept_partials(x: torch.Tensor, params, m, z, work, where, bound, block: int, per_program: int,
                  chunks_p2: int) -> None:
    """For the rows in `work` (a count, then row ids): replace pass 1's chunk partials m, z by those of the kept set,
    store t in bound[:, 0] and each chunk's highest kept tie id in `where`. Other rows untouched.
    A program takes `per_program` chunks (a part), as pass 1 does."""
    batch, vocab = x.shape
    chunks = m.shape[1]
    parts = cdiv(chunks, per_program)
    bins = 1 << _BITS
    count = torch.empty((2, batch, parts, bins), dtype=torch.int32, device=x.device)
    mass = torch.empty((2, batch, parts, bins), dtype=torch.float32, device=x.device)
    state_i = torch.empty((2, batch, 2), dtype=torch.int32, device=x.device)
    state_f = torch.empty((batch, 4), dtype=torch.float32, device=x.device)
    part = torch.empty((batch, parts), dtype=torch.int32, device=x.device)
    rows = min(cdiv(batch, _LISTED), _ROWS)
    groups = cdiv(batch, rows)
    rounds = 32 // _BITS
    done = torch.zeros(rounds * groups, dtype=torch.int32, device=x.device)
    sub = min(_SUB, block)
    assert per_program * block // sub < 256, "a packed count's byte would overflow"
    launch(_select_kernel, ((rounds + 1) * groups * parts,),
        x, x.stride(0), *params, m, z, work, where, bound, count, mass, state_i, state_f, part, done, vocab, chunks,
        parts, batch, groups, BLOCK=block, CHUNKS=per_program, SUB=sub, CP=chunks_p2,
        PP=max(2, next_power_of_2(parts)), BINS=bins, BITS=_BITS, ROUNDS=rounds, ROWS=rows, num_warps=_WARPS,
        enable_fp_fusion=False)
