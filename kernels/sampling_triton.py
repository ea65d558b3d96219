"""Triton kernels behind kernels.sampling.

Each row's vocabulary is cut into splits of a fixed SPLIT tokens, one program per
(row, split), walked in BLOCK-sized chunks with per-lane partials (max, sum, best
index); a second launch merges a row's split partials in split order. Split and
chunk sizes are constants, so the order of every floating-point operation on a
row is fixed by V alone — never by B, the row's position, or the other rows. No
atomics and nothing shared between rows.

Top-k / top-p need the boundary of the kept prefix first: one program per row
finds it by bisection over an order-preserving int32 image of the fp32 scores
(at most 32 passes over the row), then counts boundary ties per split so that the
split programs can rank ties by token id. Rows without a filter skip that ranking
inside the sampler's loop.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.philox import philox4x32, uniform_open

# Split / chunk sizes and warps. The _REDUCE_* and _THRESHOLD_* ones fix the order of
# floating-point sums (logsumexp, top-p mass), so changing them changes low bits and
# KERNEL_VERSION must move with them. argmax and the sampler's pick are exact selections
# (max, ties to the lowest id) over per-token scores, so for them the sizes only decide
# which program looks at which token.
_REDUCE_SPLIT = 8192
_REDUCE_BLOCK = 4096
_REDUCE_WARPS = 8
_SAMPLE_SPLIT = 4096
_SAMPLE_BLOCK = 2048
_SAMPLE_WARPS = 8
_THRESHOLD_BLOCK = 2048
_THRESHOLD_WARPS = 16


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def _layout(vocab: int, split: int, block: int) -> tuple[int, int, int, int]:
    """(split, block, number of splits, its power of two) for a vocabulary, with block dividing split."""
    block = min(block, max(16, triton.next_power_of_2(vocab)))
    split = max(split, block)
    parts = triton.cdiv(vocab, split)
    return split, block, parts, max(2, triton.next_power_of_2(parts))


# ---------------------------------------------------------------- logsumexp / log_softmax


@triton.jit
def _lse_partial_kernel(x_ptr, stride, m_ptr, z_ptr, V, S, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    z = tl.zeros([BLOCK], tl.float32)
    for start in range(part * SPLIT, part * SPLIT + SPLIT, BLOCK):
        x = tl.load(base + start + offs, mask=start + offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf keeps z = 0 instead of exp(-inf - -inf) = nan.
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        z = z * tl.exp(m - ref) + tl.exp(x - ref)
        m = m_new
    top = tl.max(m, axis=0)
    ref = tl.where(top == float("-inf"), 0.0, top)
    tl.store(m_ptr + row * S + part, top)
    tl.store(z_ptr + row * S + part, tl.sum(z * tl.exp(m - ref), axis=0))


@triton.jit
def _merged_lse(m_ptr, z_ptr, row, S, SP: tl.constexpr):
    i = tl.arange(0, SP)
    m = tl.load(m_ptr + row * S + i, mask=i < S, other=float("-inf"))
    z = tl.load(z_ptr + row * S + i, mask=i < S, other=0.0)
    top = tl.max(m, axis=0)
    ref = tl.where(top == float("-inf"), 0.0, top)
    return ref + tl.log(tl.sum(z * tl.exp(m - ref), axis=0))


@triton.jit
def _lse_merge_kernel(m_ptr, z_ptr, out_ptr, S, SP: tl.constexpr):
    row = tl.program_id(0)
    tl.store(out_ptr + row, _merged_lse(m_ptr, z_ptr, row, S, SP))


@triton.jit
def _log_softmax_write_kernel(x_ptr, stride, m_ptr, z_ptr, out_ptr, V, S, SPLIT: tl.constexpr,
                              BLOCK: tl.constexpr, SP: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    # Every split program of a row merges the same partials in the same order: same lse bits.
    lse = _merged_lse(m_ptr, z_ptr, row, S, SP)
    base = x_ptr + row.to(tl.int64) * stride
    out = out_ptr + row.to(tl.int64) * V
    offs = tl.arange(0, BLOCK)
    for start in range(part * SPLIT, part * SPLIT + SPLIT, BLOCK):
        mask = start + offs < V
        x = tl.load(base + start + offs, mask=mask).to(tl.float32)
        tl.store(out + start + offs, x - lse, mask=mask)


def _lse_partials(x: torch.Tensor):
    split, block, parts, parts_p2 = _layout(x.shape[1], _REDUCE_SPLIT, _REDUCE_BLOCK)
    m = torch.empty((x.shape[0], parts), dtype=torch.float32, device=x.device)
    z = torch.empty_like(m)
    _lse_partial_kernel[(x.shape[0], parts)](x, x.stride(0), m, z, x.shape[1], parts, SPLIT=split, BLOCK=block,
                                             num_warps=_REDUCE_WARPS)
    return m, z, (split, block, parts, parts_p2)


def logsumexp(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    m, z, (_, _, parts, parts_p2) = _lse_partials(x)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _lse_merge_kernel[(x.shape[0],)](m, z, out, parts, SP=parts_p2)
    return out


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    m, z, (split, block, parts, parts_p2) = _lse_partials(x)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _log_softmax_write_kernel[(x.shape[0], parts)](x, x.stride(0), m, z, out, x.shape[1], parts, SPLIT=split,
                                                   BLOCK=block, SP=parts_p2, num_warps=_REDUCE_WARPS)
    return out


# ---------------------------------------------------------------- argmax


@triton.jit
def _argmax_partial_kernel(x_ptr, stride, best_ptr, where_ptr, V, S, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.full([BLOCK], V, tl.int32)
    for start in range(part * SPLIT, part * SPLIT + SPLIT, BLOCK):
        ids = start + offs
        valid = ids < V
        x = tl.load(base + ids, mask=valid, other=float("-inf")).to(tl.float32)
        # Strictly greater: chunks come in id order, so a lane keeps its lowest-id maximum.
        take = valid & ((x > best) | (where == V))
        best = tl.where(take, x, best)
        where = tl.where(take, ids, where)
    top = tl.max(best, axis=0)
    tl.store(best_ptr + row * S + part, top)
    tl.store(where_ptr + row * S + part, tl.min(tl.where(best == top, where, V), axis=0))


@triton.jit
def _argmax_merge_kernel(best_ptr, where_ptr, out_ptr, V, S, SP: tl.constexpr):
    row = tl.program_id(0)
    i = tl.arange(0, SP)
    best = tl.load(best_ptr + row * S + i, mask=i < S, other=float("-inf"))
    where = tl.load(where_ptr + row * S + i, mask=i < S, other=V)
    top = tl.max(best, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best == top, where, V), axis=0).to(tl.int64))


def _merge_argmax(best: torch.Tensor, where: torch.Tensor, vocab: int, parts_p2: int) -> torch.Tensor:
    out = torch.empty(best.shape[0], dtype=torch.int64, device=best.device)
    _argmax_merge_kernel[(best.shape[0],)](best, where, out, vocab, best.shape[1], SP=parts_p2)
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    split, block, parts, parts_p2 = _layout(x.shape[1], _REDUCE_SPLIT, _REDUCE_BLOCK)
    best = torch.empty((x.shape[0], parts), dtype=torch.float32, device=x.device)
    where = torch.empty((x.shape[0], parts), dtype=torch.int32, device=x.device)
    _argmax_partial_kernel[(x.shape[0], parts)](x, x.stride(0), best, where, x.shape[1], parts, SPLIT=split,
                                                BLOCK=block, num_warps=_REDUCE_WARPS)
    return _merge_argmax(best, where, x.shape[1], parts_p2)


# ---------------------------------------------------------------- sampler


@triton.jit
def _order_key(s):
    # fp32 -> int32 whose signed order is the float order: flip the magnitude bits of negatives.
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V):
    temperature = tl.load(temp_ptr + row)
    greedy = temperature <= 0.0
    # The same IEEE round-to-nearest division as sampling.reciprocal_temperature; done here
    # rather than in torch because that costs five small launches per call.
    inverse = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, temperature)))
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    k_on = (top_k > 0) & (top_k < V) & (greedy == 0)
    p_on = (top_p < 1.0) & (greedy == 0)
    return greedy, inverse, top_k, top_p, k_on, p_on


@triton.jit
def _scaled_chunk(base, ids, V, inverse):
    valid = ids < V
    x = tl.load(base + ids, mask=valid, other=float("-inf")).to(tl.float32)
    s = x * inverse
    return tl.where(s == 0.0, 0.0, s), valid


@triton.jit
def _mass_from(base, V, inverse, row_max, threshold, with_mass, BLOCK: tl.constexpr):
    """(count, sum of exp(s - row_max)) over the tokens whose key >= threshold; the sum
    stays 0 unless with_mass (top-k alone needs only the count, and the exp is most of a pass)."""
    offs = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        s, valid = _scaled_chunk(base, start + offs, V, inverse)
        inside = valid & (_order_key(s) >= threshold)
        count += inside.to(tl.int32)
        if with_mass:
            mass += tl.where(inside, tl.exp(s - row_max), 0.0)
    return tl.sum(count, axis=0), tl.sum(mass, axis=0)


@triton.jit
def _threshold_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, state_i_ptr, state_f_ptr, ties_ptr,
                      V, S, SPLIT: tl.constexpr, BLOCK: tl.constexpr, SP: tl.constexpr):
    """Per row: the kept prefix's boundary key t, the count and mass strictly above it,
    and, per split, how many boundary ties come before it (rows without a filter get t = INT32_MIN)."""
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    greedy, inverse, top_k, top_p, k_on, p_on = _row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    offs = tl.arange(0, BLOCK)
    threshold = tl.full([], -2147483648, tl.int32)
    above_count = tl.full([], 0, tl.int32)
    above_mass = tl.full([], 0.0, tl.float32)
    row_max = tl.full([], 0.0, tl.float32)
    needed_mass = tl.full([], 0.0, tl.float32)
    parts = tl.arange(0, SP)
    ties_before = tl.zeros([SP], tl.int32)
    if k_on | p_on:
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        z = tl.zeros([BLOCK], tl.float32)
        lowest = tl.full([BLOCK], 2147483647, tl.int32)
        for start in range(0, V, BLOCK):
            s, valid = _scaled_chunk(base, start + offs, V, inverse)
            m_new = tl.maximum(m, s)
            ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            z = z * tl.exp(m - ref) + tl.exp(s - ref)
            m = m_new
            lowest = tl.where(valid, tl.minimum(lowest, _order_key(s)), lowest)
        row_max = tl.max(m, axis=0)
        needed_mass = top_p * tl.sum(z * tl.exp(m - row_max), axis=0)
        # Largest t whose set {key >= t} meets an active condition: lo always does, hi never.
        lo = tl.min(lowest, axis=0).to(tl.int64)
        hi = _order_key(row_max).to(tl.int64) + 1
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            count, mass = _mass_from(base, V, inverse, row_max, mid.to(tl.int32), p_on, BLOCK)
            if (k_on & (count >= top_k)) | (p_on & (mass >= needed_mass)):
                lo = mid
            else:
                hi = mid
                above_count = count
                above_mass = mass
        threshold = lo.to(tl.int32)
        seen = tl.full([], 0, tl.int32)
        for part in range(0, S):
            ties_before = tl.where(parts == part, seen, ties_before)
            for start in range(part * SPLIT, part * SPLIT + SPLIT, BLOCK):
                s, valid = _scaled_chunk(base, start + offs, V, inverse)
                seen += tl.sum((valid & (_order_key(s) == threshold)).to(tl.int32), axis=0)
    tl.store(ties_ptr + row * S + parts, ties_before, mask=parts < S)
    tl.store(state_i_ptr + row * 2, threshold)
    tl.store(state_i_ptr + row * 2 + 1, above_count)
    tl.store(state_f_ptr + row * 3, above_mass)
    tl.store(state_f_ptr + row * 3 + 1, row_max)
    tl.store(state_f_ptr + row * 3 + 2, needed_mass)


@triton.jit
def _noise_words(first, step_lo, step_hi, seed_lo, seed_hi, GROUPS: tl.constexpr):
    """Philox words for tokens first .. first + 4 * GROUPS - 1 (first a multiple of 4), in token order."""
    lane0 = tl.zeros([GROUPS], tl.uint32)
    o0, o1, o2, o3 = philox4x32((first // 4 + tl.arange(0, GROUPS)).to(tl.uint32), lane0 + step_lo,
                                lane0 + step_hi, lane0, seed_lo, seed_hi)
    # Token 4g + w takes word w of call g: interleaving twice lays the words out in that
    # order inside each thread's registers, where selecting a word per token would need
    # a [GROUPS, 4] layout and a conversion back to the flat one.
    return tl.interleave(tl.interleave(o0, o2), tl.interleave(o1, o3))


@triton.jit
def _sample_partial_kernel(x_ptr, stride, seed_ptr, step_ptr, temp_ptr, top_k_ptr, top_p_ptr,
                           state_i_ptr, state_f_ptr, ties_ptr, best_ptr, where_ptr,
                           V, S, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride
    greedy, inverse, top_k, top_p, k_on, p_on = _row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    filtered = k_on | p_on
    threshold = tl.load(state_i_ptr + row * 2)
    above_count = tl.load(state_i_ptr + row * 2 + 1)
    above_mass = tl.load(state_f_ptr + row * 3)
    row_max = tl.load(state_f_ptr + row * 3 + 1)
    needed_mass = tl.load(state_f_ptr + row * 3 + 2)
    ties_before = tl.load(ties_ptr + row * S + part)

    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    step_lo = (step & 0xFFFFFFFF).to(tl.uint32)
    step_hi = ((step >> 32) & 0xFFFFFFFF).to(tl.uint32)
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    seed_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)

    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.full([BLOCK], V, tl.int32)
    for start in range(part * SPLIT, part * SPLIT + SPLIT, BLOCK):
        ids = start + offs
        s, valid = _scaled_chunk(base, ids, V, inverse)
        if greedy:
            score = s
        else:
            bits = _noise_words(start, step_lo, step_hi, seed_lo, seed_hi, BLOCK // 4)
            score = s - tl.log(-tl.log(uniform_open(bits)))
        keep = valid
        # Unfiltered rows (the common case) skip the tie ranking: its scan and exp cost
        # more than the noise itself.
        if filtered:
            key = _order_key(s)
            tie = valid & (key == threshold)
            tie_i = tie.to(tl.int32)
            # 1-based rank of each tie among this row's ties, in token-id order.
            rank = ties_before + tl.cumsum(tie_i, axis=0)
            ties_before += tl.sum(tie_i, axis=0)
            prior = above_count + rank - 1
            prior_mass = above_mass + (rank - 1).to(tl.float32) * tl.exp(s - row_max)
            # tl.where rather than scalar & block: the interpreter mis-types that mix.
            full = (prior >= 1) & (tl.where(k_on, prior >= top_k, False) |
                                   tl.where(p_on, prior_mass >= needed_mass, False))
            keep = valid & ((key > threshold) | (tie & ~full))
        take = keep & ((score > best) | (where == V))
        best = tl.where(take, score, best)
        where = tl.where(take, ids, where)
    top = tl.max(best, axis=0)
    tl.store(best_ptr + row * S + part, top)
    tl.store(where_ptr + row * S + part, tl.min(tl.where(best == top, where, V), axis=0))


def sample(logits, seeds, steps, temperature, top_k, top_p) -> torch.Tensor:
    x = _rows(logits)
    batch, vocab = x.shape
    device = x.device
    temperature = temperature.to(device=device, dtype=torch.float32).contiguous()
    params = (temperature, top_k.to(device=device, dtype=torch.int32).contiguous(),
              top_p.to(device=device, dtype=torch.float32).contiguous())
    split, block, parts, parts_p2 = _layout(vocab, _SAMPLE_SPLIT, _SAMPLE_BLOCK)
    state_i = torch.empty((batch, 2), dtype=torch.int32, device=device)
    state_f = torch.empty((batch, 3), dtype=torch.float32, device=device)
    ties = torch.empty((batch, parts), dtype=torch.int32, device=device)
    # Exact IEEE products and sums (no fused multiply-add), as in the torch reference.
    _threshold_kernel[(batch,)](x, x.stride(0), *params, state_i, state_f, ties, vocab, parts, SPLIT=split,
                                BLOCK=min(block, _THRESHOLD_BLOCK), SP=parts_p2, num_warps=_THRESHOLD_WARPS,
                                enable_fp_fusion=False)
    best = torch.empty((batch, parts), dtype=torch.float32, device=device)
    where = torch.empty((batch, parts), dtype=torch.int32, device=device)
    _sample_partial_kernel[(batch, parts)](
        x, x.stride(0), seeds.to(device=device, dtype=torch.int64).contiguous(),
        steps.to(device=device, dtype=torch.int64).contiguous(), *params, state_i, state_f, ties, best, where,
        vocab, parts, SPLIT=split, BLOCK=block, num_warps=_SAMPLE_WARPS, enable_fp_fusion=False,
    )
    return _merge_argmax(best, where, vocab, parts_p2)


@triton.jit
def _random_bits_kernel(seed_ptr, step_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    offs = tl.arange(0, BLOCK)
    for start in range(0, V, BLOCK):
        bits = _noise_words(start, (step & 0xFFFFFFFF).to(tl.uint32), ((step >> 32) & 0xFFFFFFFF).to(tl.uint32),
                            (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32), BLOCK // 4)
        ids = start + offs
        tl.store(out_ptr + row.to(tl.int64) * V + ids, bits.to(tl.int64), mask=ids < V)


def random_bits(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """The sampler's raw noise words, int64 [B, vocab] (equal to philox.random_bits_reference)."""
    out = torch.empty((seeds.shape[0], vocab), dtype=torch.int64, device=seeds.device)
    _, block, _, _ = _layout(vocab, _SAMPLE_SPLIT, _SAMPLE_BLOCK)
    _random_bits_kernel[(seeds.shape[0],)](seeds.to(torch.int64).contiguous(), steps.to(torch.int64).contiguous(),
                                           out, vocab, BLOCK=block)
    return out
