"""Triton kernels behind kernels.sampling.

A row's vocabulary is read in chunks of a fixed BLOCK tokens, several chunks per
program. Every floating-point sum is taken inside one chunk (a partial: the
chunk's max and its sum of exp(s - max)) and the partials are merged in chunk
order by a second launch, so the order of every operation on a row is fixed by V
and BLOCK alone — never by B, the row's position, the other rows, or how many
chunks one program takes. No atomics and nothing shared between rows.

The sampler inverts each row's CDF at one uniform u in two launches: pass 1
writes the chunk partials, pass 2 (one program per row) finds the chunk where the
running mass crosses u * total, then the token inside that chunk by a prefix sum
over it. For rows without top-k / top-p only pass 1 reads the whole row, so the
sampler runs at the speed of logsumexp plus one short launch. A top-k / top-p row
is done whole by its pass-2 program, which first finds the kept set's boundary by
bisection (_filtered_row: up to 34 passes over the row, the slow path).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.philox import row_uniform

# _BLOCK fixes the order of every floating-point sum (logsumexp, log_softmax, the
# sampler's masses, the top-p masses that decide the kept set), so changing it
# changes low bits and KERNEL_VERSION must move with it. _CHUNKS (chunks per
# program) and _WARPS only shape the launch (H100, V = 152064: 2 chunks per program
# measured faster than 4 or 8).
_BLOCK = 4096
_CHUNKS = 2
_WARPS = 8


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def _layout(vocab: int) -> tuple[int, int, int, int]:
    """(block, chunks, chunks per program, chunks rounded up to a power of two) for a vocabulary."""
    block = min(_BLOCK, max(16, triton.next_power_of_2(vocab)))
    chunks = triton.cdiv(vocab, block)
    return block, chunks, min(_CHUNKS, chunks), max(2, triton.next_power_of_2(chunks))


@triton.jit
def _chunk_mass(s):
    """(max, sum of exp(s - max)) of one chunk: one exp per token, the rescale left to the merge."""
    top = tl.max(s, axis=0)
    # A chunk of only -inf keeps mass 0 instead of exp(-inf - -inf) = nan.
    ref = tl.where(top == float("-inf"), 0.0, top)
    return top, tl.sum(tl.exp(s - ref), axis=0)


@triton.jit
def _load_partials(m_ptr, z_ptr, C, CP: tl.constexpr):
    i = tl.arange(0, CP)
    return tl.load(m_ptr + i, mask=i < C, other=float("-inf")), tl.load(z_ptr + i, mask=i < C, other=0.0)


@triton.jit
def _merged_mass(m, z):
    """Row max, each chunk's mass rescaled to it, and their sum, from a row's chunk partials."""
    top = tl.max(m, axis=0)
    ref = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(m == float("-inf"), 0.0, z * tl.exp(m - ref))
    return ref, w, tl.sum(w, axis=0)


# ---------------------------------------------------------------- logsumexp / log_softmax


@triton.jit
def _lse_partial_kernel(x_ptr, stride, m_ptr, z_ptr, V, C, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    first = tl.program_id(0) * CHUNKS
    row = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    for c in range(first, tl.minimum(first + CHUNKS, C)):
        ids = c * BLOCK + offs
        x = tl.load(base + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
        top, mass = _chunk_mass(x)
        tl.store(m_ptr + row * C + c, top)
        tl.store(z_ptr + row * C + c, mass)


@triton.jit
def _lse_merge_kernel(m_ptr, z_ptr, out_ptr, C, CP: tl.constexpr):
    row = tl.program_id(0)
    m, z = _load_partials(m_ptr + row * C, z_ptr + row * C, C, CP)
    ref, _, total = _merged_mass(m, z)
    tl.store(out_ptr + row, ref + tl.log(total))


@triton.jit
def _log_softmax_write_kernel(x_ptr, stride, m_ptr, z_ptr, out_ptr, V, C, BLOCK: tl.constexpr,
                              CHUNKS: tl.constexpr, CP: tl.constexpr):
    first = tl.program_id(0) * CHUNKS
    # The last rows of pass 1 are the likeliest still in L2: start with them.
    row = tl.num_programs(1) - 1 - tl.program_id(1)
    # Every program of a row merges the same partials in the same order: the same lse bits.
    m, z = _load_partials(m_ptr + row * C, z_ptr + row * C, C, CP)
    ref, _, total = _merged_mass(m, z)
    lse = ref + tl.log(total)
    base = x_ptr + row.to(tl.int64) * stride
    out = out_ptr + row.to(tl.int64) * V
    offs = tl.arange(0, BLOCK)
    for c in range(first, tl.minimum(first + CHUNKS, C)):
        ids = c * BLOCK + offs
        x = tl.load(base + ids, mask=ids < V).to(tl.float32)
        tl.store(out + ids, x - lse, mask=ids < V)


def _lse_partials(x: torch.Tensor):
    block, chunks, per_program, chunks_p2 = _layout(x.shape[1])
    m = torch.empty((x.shape[0], chunks), dtype=torch.float32, device=x.device)
    z = torch.empty_like(m)
    grid = (triton.cdiv(chunks, per_program), x.shape[0])
    _lse_partial_kernel[grid](x, x.stride(0), m, z, x.shape[1], chunks, BLOCK=block, CHUNKS=per_program,
                              num_warps=_WARPS)
    return m, z, grid, chunks_p2


def logsumexp(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    m, z, _, chunks_p2 = _lse_partials(x)
    out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _lse_merge_kernel[(x.shape[0],)](m, z, out, m.shape[1], CP=chunks_p2)
    return out


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    m, z, grid, chunks_p2 = _lse_partials(x)
    block, chunks, per_program, _ = _layout(x.shape[1])
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _log_softmax_write_kernel[grid](x, x.stride(0), m, z, out, x.shape[1], chunks, BLOCK=block, CHUNKS=per_program,
                                    CP=chunks_p2, num_warps=_WARPS)
    return out


# ---------------------------------------------------------------- argmax


@triton.jit
def _argmax_partial_kernel(x_ptr, stride, best_ptr, where_ptr, V, P, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.full([BLOCK], V, tl.int32)
    for start in range(part * CHUNKS * BLOCK, part * CHUNKS * BLOCK + CHUNKS * BLOCK, BLOCK):
        ids = start + offs
        valid = ids < V
        x = tl.load(base + ids, mask=valid, other=float("-inf")).to(tl.float32)
        # Strictly greater: chunks come in id order, so a lane keeps its lowest-id maximum.
        take = valid & ((x > best) | (where == V))
        best = tl.where(take, x, best)
        where = tl.where(take, ids, where)
    top = tl.max(best, axis=0)
    tl.store(best_ptr + row * P + part, top)
    tl.store(where_ptr + row * P + part, tl.min(tl.where(best == top, where, V), axis=0))


@triton.jit
def _argmax_merge_kernel(best_ptr, where_ptr, out_ptr, V, P, PP: tl.constexpr):
    row = tl.program_id(0)
    i = tl.arange(0, PP)
    best = tl.load(best_ptr + row * P + i, mask=i < P, other=float("-inf"))
    where = tl.load(where_ptr + row * P + i, mask=i < P, other=V)
    top = tl.max(best, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best == top, where, V), axis=0).to(tl.int64))


def argmax(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    batch, vocab = x.shape
    block, chunks, per_program, _ = _layout(vocab)
    parts = triton.cdiv(chunks, per_program)
    best = torch.empty((batch, parts), dtype=torch.float32, device=x.device)
    where = torch.empty((batch, parts), dtype=torch.int32, device=x.device)
    # Rows fastest in the grid: measured 4-8% faster than splits fastest on an H100.
    _argmax_partial_kernel[(batch, parts)](x, x.stride(0), best, where, vocab, parts, BLOCK=block,
                                           CHUNKS=per_program, num_warps=_WARPS)
    out = torch.empty(batch, dtype=torch.int64, device=x.device)
    _argmax_merge_kernel[(batch,)](best, where, out, vocab, parts, PP=max(2, triton.next_power_of_2(parts)))
    return out


# ---------------------------------------------------------------- sampler


@triton.jit
def _order_key(s):
    # fp32 -> int32 whose signed order is the float order: flip the magnitude bits of negatives.
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _from_order_key(key):
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


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
def _kept(s, ids, valid, threshold, cut):
    """The kept set: keys above the boundary, and boundary ties up to the cut id."""
    key = _order_key(s)
    return valid & ((key > threshold) | ((key == threshold) & (ids <= cut)))


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
def _filtered_row(base, inverse, top_k, top_p, k_on, p_on, V, C, BLOCK: tl.constexpr, CP: tl.constexpr):
    """A top-k / top-p row, whole, in one program: its kept set's boundary key t, the highest
    kept id among the tokens whose key is t (ties at the boundary are kept in id order), and
    the chunk partials over the kept tokens. t is found by bisection over an order-preserving
    int32 image of the fp32 scores, at most 32 passes over the row."""
    offs = tl.arange(0, BLOCK)
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
    above_count = tl.full([], 0, tl.int32)
    above_mass = tl.full([], 0.0, tl.float32)
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
    tie_weight = tl.exp(_from_order_key(threshold) - row_max)
    seen = tl.full([], 0, tl.int32)
    cut = tl.full([], -1, tl.int32)
    chunk = tl.arange(0, CP)
    tops = tl.full([CP], float("-inf"), tl.float32)
    masses = tl.zeros([CP], tl.float32)
    for c in range(0, C):
        ids = c * BLOCK + offs
        s, valid = _scaled_chunk(base, ids, V, inverse)
        key = _order_key(s)
        tie = valid & (key == threshold)
        tie_i = tie.to(tl.int32)
        # A boundary tie is kept while the prefix before it still misses every active condition.
        rank = seen + tl.cumsum(tie_i, axis=0) - 1
        prior = above_count + rank
        prior_mass = above_mass + rank.to(tl.float32) * tie_weight
        # tl.where rather than scalar & block: the interpreter mis-types that mix.
        full = (prior >= 1) & (tl.where(k_on, prior >= top_k, False) |
                               tl.where(p_on, prior_mass >= needed_mass, False))
        kept_tie = tie & ~full
        cut = tl.maximum(cut, tl.max(tl.where(kept_tie, ids, -1), axis=0))
        seen += tl.sum(tie_i, axis=0)
        top, mass = _chunk_mass(tl.where((valid & (key > threshold)) | kept_tie, s, float("-inf")))
        tops = tl.where(chunk == c, top, tops)
        masses = tl.where(chunk == c, mass, masses)
    return threshold, cut, tops, masses


@triton.jit
def _sample_partial_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, where_ptr,
                           V, C, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """Per chunk of a row without top-k / top-p: the max score and, for sampled rows, the
    chunk's mass; for greedy rows, the lowest id holding the max instead."""
    part = tl.program_id(0)
    row = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride
    greedy, inverse, top_k, top_p, k_on, p_on = _row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    # Filtered rows are done whole by their pick program.
    if (k_on | p_on) == 0:
        offs = tl.arange(0, BLOCK)
        for c in range(part * CHUNKS, tl.minimum(part * CHUNKS + CHUNKS, C)):
            ids = c * BLOCK + offs
            # Unscaled -0.0 is harmless here: -0.0 and 0.0 compare equal and have the same exp.
            x = tl.load(base + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
            if greedy:
                top = tl.max(x, axis=0)
                tl.store(m_ptr + row * C + c, top)
                tl.store(where_ptr + row * C + c, tl.min(tl.where((ids < V) & (x == top), ids, V), axis=0))
            else:
                top, mass = _chunk_mass(x * inverse)
                tl.store(m_ptr + row * C + c, top)
                tl.store(z_ptr + row * C + c, mass)


@triton.jit
def _sample_pick_kernel(x_ptr, stride, seed_ptr, step_ptr, temp_ptr, top_k_ptr, top_p_ptr, bound_ptr,
                        m_ptr, z_ptr, where_ptr, out_ptr, V, C, BLOCK: tl.constexpr, CP: tl.constexpr):
    """One program per row: the token, and the row's kept-set bounds (for tests). Greedy rows
    merge the argmax partials; sampled rows invert the CDF, a top-k / top-p row after
    computing its kept set and chunk partials here (_filtered_row)."""
    row = tl.program_id(0)
    greedy, inverse, top_k, top_p, k_on, p_on = _row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    base = x_ptr + row.to(tl.int64) * stride
    i = tl.arange(0, CP)
    threshold = tl.full([], -2147483648, tl.int32)
    cut = V
    if greedy:
        best = tl.load(m_ptr + row * C + i, mask=i < C, other=float("-inf"))
        where = tl.load(where_ptr + row * C + i, mask=i < C, other=V)
        token = tl.min(tl.where(best == tl.max(best, axis=0), where, V), axis=0)
    else:
        if k_on | p_on:
            threshold, cut, m, z = _filtered_row(base, inverse, top_k, top_p, k_on, p_on, V, C, BLOCK, CP)
        else:
            m, z = _load_partials(m_ptr + row * C, z_ptr + row * C, C, CP)
        ref, w, _ = _merged_mass(m, z)
        running = tl.cumsum(w, axis=0)
        # Sums of non-negative terms only grow: the last running sum is the largest.
        target = row_uniform(tl.load(seed_ptr + row), tl.load(step_ptr + row)) * tl.max(running, axis=0)
        # The first chunk whose running mass passes the target; if rounding leaves it
        # unreached, the last chunk with any mass.
        c = tl.min(tl.where(running > target, i, CP), axis=0)
        c = tl.where(c == CP, tl.max(tl.where(w > 0.0, i, 0), axis=0), c)
        before = tl.max(tl.where(i < c, running, 0.0), axis=0)
        ids = c * BLOCK + tl.arange(0, BLOCK)
        s, valid = _scaled_chunk(base, ids, V, inverse)
        e = tl.where(_kept(s, ids, valid, threshold, cut), tl.exp(s - ref), 0.0)
        inside = before + tl.cumsum(e, axis=0)
        token = tl.min(tl.where((inside > target) & (e > 0.0), ids, V), axis=0)
        # Same fallback inside the chunk; 0 when nothing has mass (every kept score -inf).
        token = tl.where(token == V, tl.maximum(tl.max(tl.where(e > 0.0, ids, -1), axis=0), 0), token)
    tl.store(out_ptr + row, token.to(tl.int64))
    tl.store(bound_ptr + row * 2, threshold)
    tl.store(bound_ptr + row * 2 + 1, cut)


def _sample(x: torch.Tensor, seeds, steps, temperature, top_k, top_p):
    batch, vocab = x.shape
    device = x.device
    params = (temperature.to(device=device, dtype=torch.float32).contiguous(),
              top_k.to(device=device, dtype=torch.int32).contiguous(),
              top_p.to(device=device, dtype=torch.float32).contiguous())
    block, chunks, per_program, chunks_p2 = _layout(vocab)
    m = torch.empty((batch, chunks), dtype=torch.float32, device=device)
    z = torch.empty_like(m)
    where = torch.empty((batch, chunks), dtype=torch.int32, device=device)
    # Exact IEEE products and sums (no fused multiply-add), as in the torch reference.
    _sample_partial_kernel[(triton.cdiv(chunks, per_program), batch)](
        x, x.stride(0), *params, m, z, where, vocab, chunks, BLOCK=block, CHUNKS=per_program, num_warps=_WARPS,
        enable_fp_fusion=False)
    out = torch.empty(batch, dtype=torch.int64, device=device)
    bound = torch.empty((batch, 2), dtype=torch.int32, device=device)
    _sample_pick_kernel[(batch,)](
        x, x.stride(0), seeds.to(device=device, dtype=torch.int64).contiguous(),
        steps.to(device=device, dtype=torch.int64).contiguous(), *params, bound, m, z, where, out, vocab, chunks,
        BLOCK=block, CP=chunks_p2, num_warps=_WARPS, enable_fp_fusion=False)
    return out, bound


def sample(logits, seeds, steps, temperature, top_k, top_p) -> torch.Tensor:
    return _sample(_rows(logits), seeds, steps, temperature, top_k, top_p)[0]


def kept_bounds(logits, temperature, top_k, top_p) -> torch.Tensor:
    """int32 [B, 2]: per row the boundary key and cut id that _kept tests (exposed for tests)."""
    zeros = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    return _sample(_rows(logits), zeros, zeros, temperature, top_k, top_p)[1]


@triton.jit
def _row_uniform_kernel(seed_ptr, step_ptr, out_ptr):
    row = tl.program_id(0)
    tl.store(out_ptr + row, row_uniform(tl.load(seed_ptr + row), tl.load(step_ptr + row)))


def row_uniforms(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The sampler's u per row, fp32 [B] (equal to philox.row_uniform_reference; exposed for tests)."""
    out = torch.empty(seeds.shape[0], dtype=torch.float32, device=seeds.device)
    _row_uniform_kernel[(seeds.shape[0],)](seeds.to(torch.int64).contiguous(), steps.to(torch.int64).contiguous(), out)
    return out
