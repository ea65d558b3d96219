"""Triton kernels behind kernels.sampling: one program per row, chunked over V.

Each program walks its row in fixed BLOCK-sized chunks from id 0 upwards and
keeps per-lane partial results (max, sum, best index) that are merged once, at
the end, in a fixed tree. The chunk size depends only on V, so the order of every
floating-point operation on a row is fixed by (V, dtype) alone — never by B, the
row's position, or the other rows. No atomics, no cross-program reductions.

Top-k / top-p find the boundary of the kept prefix by bisection over an
order-preserving integer image of the fp32 scores (at most 32 passes over the
row), then break ties at the boundary value by token id with a running count.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.philox import philox4x32, uniform_open

# Chunk sizes and warps per row program; they fix each row's reduction order, so
# changing them changes low bits (and KERNEL_VERSION should move with them).
_REDUCE_BLOCK = 4096
_REDUCE_WARPS = 8
_SAMPLE_BLOCK = 2048
_SAMPLE_WARPS = 8


def _block(vocab: int, cap: int) -> int:
    return min(cap, max(16, triton.next_power_of_2(vocab)))


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


@triton.jit
def _lse_row(base, V, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    z = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(base + start + offs, mask=start + offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf keeps z = 0 instead of exp(-inf - -inf) = nan.
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        z = z * tl.exp(m - ref) + tl.exp(x - ref)
        m = m_new
    top = tl.max(m, axis=0)
    ref = tl.where(top == float("-inf"), 0.0, top)
    return ref + tl.log(tl.sum(z * tl.exp(m - ref), axis=0))


@triton.jit
def _logsumexp_kernel(x_ptr, stride, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    tl.store(out_ptr + row, _lse_row(x_ptr + row.to(tl.int64) * stride, V, BLOCK))


@triton.jit
def _log_softmax_kernel(x_ptr, stride, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    lse = _lse_row(base, V, BLOCK)
    out = out_ptr + row.to(tl.int64) * V
    offs = tl.arange(0, BLOCK)
    for start in range(0, V, BLOCK):
        mask = start + offs < V
        x = tl.load(base + start + offs, mask=mask).to(tl.float32)
        tl.store(out + start + offs, x - lse, mask=mask)


@triton.jit
def _argmax_kernel(x_ptr, stride, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.full([BLOCK], V, tl.int32)
    for start in range(0, V, BLOCK):
        ids = start + offs
        valid = ids < V
        x = tl.load(base + ids, mask=valid, other=float("-inf")).to(tl.float32)
        # Strictly greater: chunks come in id order, so a lane keeps its lowest-id maximum.
        take = valid & ((x > best) | (where == V))
        best = tl.where(take, x, best)
        where = tl.where(take, ids, where)
    top = tl.max(best, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best == top, where, V), axis=0).to(tl.int64))


@triton.jit
def _order_key(s):
    # fp32 -> int32 whose signed order is the float order: flip the magnitude bits of negatives.
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _scaled_chunk(base, ids, V, divisor):
    valid = ids < V
    x = tl.load(base + ids, mask=valid, other=float("-inf")).to(tl.float32)
    s = tl.math.div_rn(x, divisor)
    return tl.where(s == 0.0, 0.0, s), valid


@triton.jit
def _mass_from(base, V, divisor, row_max, threshold, R: tl.constexpr):
    """(count, sum of exp(s - row_max)) over the tokens whose key >= threshold."""
    ids = tl.arange(0, R)[:, None] * 4 + tl.arange(0, 4)[None, :]
    count = tl.zeros([R, 4], tl.int32)
    mass = tl.zeros([R, 4], tl.float32)
    for start in range(0, V, 4 * R):
        s, valid = _scaled_chunk(base, start + ids, V, divisor)
        inside = valid & (_order_key(s) >= threshold)
        count += inside.to(tl.int32)
        mass += tl.where(inside, tl.exp(s - row_max), 0.0)
    return tl.sum(tl.sum(count, axis=1), axis=0), tl.sum(tl.sum(mass, axis=1), axis=0)


@triton.jit
def _sample_kernel(x_ptr, stride, seed_ptr, step_ptr, temp_ptr, top_k_ptr, top_p_ptr, out_ptr,
                   V, R: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    temperature = tl.load(temp_ptr + row)
    greedy = temperature <= 0.0
    divisor = tl.where(greedy, 1.0, temperature)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    k_on = (top_k > 0) & (top_k < V) & (greedy == 0)
    p_on = (top_p < 1.0) & (greedy == 0)

    group = tl.arange(0, R)
    word = tl.arange(0, 4)[None, :]
    ids = group[:, None] * 4 + word

    # Boundary of the kept prefix: the largest key t whose set {key >= t} meets an
    # active condition; keys above t are all kept, ties at t are resolved by id below.
    threshold = tl.full([], -2147483648, tl.int32)
    above_count = tl.full([], 0, tl.int32)
    above_mass = tl.full([], 0.0, tl.float32)
    row_max = tl.full([], 0.0, tl.float32)
    needed_mass = tl.full([], 0.0, tl.float32)
    if k_on | p_on:
        m = tl.full([R, 4], float("-inf"), tl.float32)
        z = tl.zeros([R, 4], tl.float32)
        lowest = tl.full([R, 4], 2147483647, tl.int32)
        for start in range(0, V, 4 * R):
            s, valid = _scaled_chunk(base, start + ids, V, divisor)
            m_new = tl.maximum(m, s)
            ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            z = z * tl.exp(m - ref) + tl.exp(s - ref)
            m = m_new
            lowest = tl.where(valid, tl.minimum(lowest, _order_key(s)), lowest)
        row_max = tl.max(tl.max(m, axis=1), axis=0)
        needed_mass = top_p * tl.sum(tl.sum(z * tl.exp(m - row_max), axis=1), axis=0)
        lo = tl.min(tl.min(lowest, axis=1), axis=0).to(tl.int64)
        hi = _order_key(row_max).to(tl.int64) + 1
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            count, mass = _mass_from(base, V, divisor, row_max, mid.to(tl.int32), R)
            if (k_on & (count >= top_k)) | (p_on & (mass >= needed_mass)):
                lo = mid
            else:
                hi = mid
                above_count = count
                above_mass = mass
        threshold = lo.to(tl.int32)

    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    lane0 = tl.zeros([R], tl.uint32)
    step_lo = lane0 + (step & 0xFFFFFFFF).to(tl.uint32)
    step_hi = lane0 + ((step >> 32) & 0xFFFFFFFF).to(tl.uint32)
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    seed_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)

    best = tl.full([R, 4], float("-inf"), tl.float32)
    where = tl.full([R, 4], V, tl.int32)
    ties_before = tl.full([], 0, tl.int32)
    for start in range(0, V, 4 * R):
        s, valid = _scaled_chunk(base, start + ids, V, divisor)
        if greedy:
            score = s
        else:
            o0, o1, o2, o3 = philox4x32((start // 4 + group).to(tl.uint32), step_lo, step_hi, lane0,
                                        seed_lo, seed_hi)
            bits = tl.where(word == 0, o0[:, None], tl.where(word == 1, o1[:, None],
                            tl.where(word == 2, o2[:, None], o3[:, None])))
            score = s - tl.log(-tl.log(uniform_open(bits)))
        key = _order_key(s)
        tie = valid & (key == threshold)
        tie_i = tie.to(tl.int32)
        # 1-based rank of each tie among this row's ties, in token-id order.
        group_ties = tl.sum(tie_i, axis=1)
        rank = ties_before + (tl.cumsum(group_ties, axis=0) - group_ties)[:, None] + tl.cumsum(tie_i, axis=1)
        ties_before += tl.sum(group_ties, axis=0)
        prior = above_count + rank - 1
        prior_mass = above_mass + (rank - 1).to(tl.float32) * tl.exp(s - row_max)
        # tl.where rather than scalar & block: the interpreter mis-types that mix.
        full = (prior >= 1) & (tl.where(k_on, prior >= top_k, False) | tl.where(p_on, prior_mass >= needed_mass, False))
        keep = valid & ((key > threshold) | (tie & ~full))
        gid = start + ids
        take = keep & ((score > best) | (where == V))
        best = tl.where(take, score, best)
        where = tl.where(take, gid, where)
    top = tl.max(tl.max(best, axis=1), axis=0)
    token = tl.min(tl.min(tl.where(best == top, where, V), axis=1), axis=0)
    tl.store(out_ptr + row, token.to(tl.int64))


def logsumexp(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _logsumexp_kernel[(x.shape[0],)](x, x.stride(0), out, x.shape[1],
                                     BLOCK=_block(x.shape[1], _REDUCE_BLOCK), num_warps=_REDUCE_WARPS)
    return out


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _log_softmax_kernel[(x.shape[0],)](x, x.stride(0), out, x.shape[1],
                                       BLOCK=_block(x.shape[1], _REDUCE_BLOCK), num_warps=_REDUCE_WARPS)
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    out = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    _argmax_kernel[(x.shape[0],)](x, x.stride(0), out, x.shape[1],
                                  BLOCK=_block(x.shape[1], _REDUCE_BLOCK), num_warps=_REDUCE_WARPS)
    return out


def sample(logits, seeds, steps, temperature, top_k, top_p) -> torch.Tensor:
    x = _rows(logits)
    device = x.device
    out = torch.empty(x.shape[0], dtype=torch.int64, device=device)
    _sample_kernel[(x.shape[0],)](
        x, x.stride(0),
        seeds.to(device=device, dtype=torch.int64).contiguous(),
        steps.to(device=device, dtype=torch.int64).contiguous(),
        temperature.to(device=device, dtype=torch.float32).contiguous(),
        top_k.to(device=device, dtype=torch.int32).contiguous(),
        top_p.to(device=device, dtype=torch.float32).contiguous(),
        out, x.shape[1], R=_block(x.shape[1], _SAMPLE_BLOCK) // 4, num_warps=_SAMPLE_WARPS,
    )
    return out


@triton.jit
def _random_bits_kernel(seed_ptr, step_ptr, out_ptr, V, R: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    group = tl.arange(0, R)
    word = tl.arange(0, 4)[None, :]
    lane0 = tl.zeros([R], tl.uint32)
    for start in range(0, V, 4 * R):
        o0, o1, o2, o3 = philox4x32((start // 4 + group).to(tl.uint32),
                                    lane0 + (step & 0xFFFFFFFF).to(tl.uint32),
                                    lane0 + ((step >> 32) & 0xFFFFFFFF).to(tl.uint32), lane0,
                                    (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        bits = tl.where(word == 0, o0[:, None], tl.where(word == 1, o1[:, None],
                        tl.where(word == 2, o2[:, None], o3[:, None])))
        ids = start + group[:, None] * 4 + word
        tl.store(out_ptr + row.to(tl.int64) * V + ids, bits.to(tl.int64), mask=ids < V)


def random_bits(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """The sampler's raw noise words, int64 [B, vocab] (equal to philox.random_bits_reference)."""
    out = torch.empty((seeds.shape[0], vocab), dtype=torch.int64, device=seeds.device)
    _random_bits_kernel[(seeds.shape[0],)](seeds.to(torch.int64).contiguous(), steps.to(torch.int64).contiguous(),
                                           out, vocab, R=_block(vocab, _SAMPLE_BLOCK) // 4)
    return out
