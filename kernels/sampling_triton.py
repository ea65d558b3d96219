"""Triton kernels behind kernels.sampling.

A row's vocabulary is read in chunks of a fixed BLOCK tokens, several chunks per
program. Every floating-point sum is taken inside one chunk (a partial: the
chunk's max and its sum of exp(s - max)) and the partials are merged in chunk
order by later programs, so the order of every operation on a row is fixed by V
and BLOCK alone (for the top-k / top-p filter, also by the chunks per program) —
never by B, the row's position or the other rows. Nothing is shared between rows,
and no sum is taken by atomics: the atomics are counts, in the one-launch log_softmax
to say when a row's partials are all stored, in sampling_candidates to hand out slots in
a row's list (whose sums are exact in any order) and to append the rows it leaves to the
radix select's work list (whose order moves no bit).

The sampler inverts each row's CDF at one uniform u: pass 1 writes the chunk
partials, the pick (one program per row) finds the chunk where the running mass
crosses u * total, then the token inside that chunk by a prefix sum over it. Only
pass 1 reads the whole row, so an unfiltered batch samples at the speed of
logsumexp plus one short launch, which (sm_90 on) starts while pass 1's last programs
run and waits for their partials. When a row has top-k / top-p, kernels/sampling_candidates.py
runs between the two: it finds the kept set from a short list of the row's top tokens and
draws the token itself (4 launches). The rows it leaves unsettled go through
kernels/sampling_filter.py (a radix select over many programs per row, one launch over a
work list of those rows, its rounds in turn), and that leaves the kept set's partials for
the pick.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import sampling_candidates, sampling_filter
from kernels.device import dependent_launch_options, let_dependents_launch, wait_for_kernel_ahead
from kernels.launch import cdiv, launch, next_power_of_2
from kernels.philox import row_uniform
from kernels.sampling_rows import (chunk_mass, crossing, kept, load_partials, merged_mass, release, row_params,
                                   scaled_chunk, wait_for)
from kernels.toolchain import FP_FUSION

# _BLOCK fixes the order of every floating-point sum (logsumexp, log_softmax, the
# sampler's masses, the top-p masses that decide the kept set), so changing it
# changes low bits and KERNEL_VERSION must move with it. _CHUNKS (chunks per
# program; H100, V = 152064: 2 measured faster than 4 or 8; the sampler's pass 1 takes
# one) only shapes the launch, except in sampling_filter, whose per-part top-p mass bins
# it groups. _WARPS moves bits like _BLOCK: it sets how a chunk's tokens spread over
# threads, and with that the tree of each chunk's sum.
_BLOCK = 4096
_CHUNKS = 2
_WARPS = 8
# log_softmax on large batches: rows between a row's partials and its writers, by logit
# element size. Too few and writers wait on partials still being summed; too many and the
# row has left L2 before they read it. H100, V = 152064, B = 256 (sweep of 8..64 rows): bf16
# 0.90 of copy bandwidth at 32 rows (0.83-0.87 at 8-16, 0.77 at 64), fp32 0.87 at 8 (0.71
# at 32). Below _ONE_LAUNCH_BYTES of logits read plus output written the two-launch path
# is as fast or faster (its second read hits L2 anyway) and needs no counters. Only timing
# depends on either.
_LAG = {2: 32, 4: 8}  # other element sizes take fp32's, the more cautious
_ONE_LAUNCH_BYTES = 40 << 20


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def _layout(vocab: int) -> tuple[int, int, int, int]:
    """(block, chunks, chunks per program, chunks rounded up to a power of two) for a vocabulary."""
    block = min(_BLOCK, max(16, next_power_of_2(vocab)))
    chunks = cdiv(vocab, block)
    return block, chunks, min(_CHUNKS, chunks), max(2, next_power_of_2(chunks))


# ---------------------------------------------------------------- logsumexp / log_softmax


@triton.jit
def _chunk_partials(base, m_row, z_row, first, C, V, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                    EVICT: tl.constexpr):
    """Store (max, mass) of chunks first .. first + CHUNKS - 1 of one row."""
    offs = tl.arange(0, BLOCK)
    for c in range(first, tl.minimum(first + CHUNKS, C)):
        ids = c * BLOCK + offs
        x = tl.load(base + ids, mask=ids < V, other=float("-inf"), eviction_policy=EVICT).to(tl.float32)
        top, mass = chunk_mass(x)
        tl.store(m_row + c, top)
        tl.store(z_row + c, mass)


@triton.jit
def _lse_partial_kernel(x_ptr, stride, m_ptr, z_ptr, V, C, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(1)
    _chunk_partials(x_ptr + row.to(tl.int64) * stride, m_ptr + row * C, z_ptr + row * C, tl.program_id(0) * CHUNKS,
                    C, V, BLOCK, CHUNKS, "")


@triton.jit
def _lse_merge_kernel(m_ptr, z_ptr, out_ptr, C, CP: tl.constexpr):
    row = tl.program_id(0)
    m, z = load_partials(m_ptr + row * C, z_ptr + row * C, C, CP)
    ref, _, total = merged_mass(m, z)
    tl.store(out_ptr + row, ref + tl.log(total))


@triton.jit
def _write_log_softmax(x_ptr, stride, m_ptr, z_ptr, out_ptr, row, first, V, C, BLOCK: tl.constexpr,
                       CHUNKS: tl.constexpr, CP: tl.constexpr):
    """x - lse over chunks first .. first + CHUNKS - 1 of one row, lse from the row's partials."""
    # Every writer of a row merges the same partials in the same order: the same lse bits.
    m, z = load_partials(m_ptr + row * C, z_ptr + row * C, C, CP)
    ref, _, total = merged_mass(m, z)
    lse = ref + tl.log(total)
    base = x_ptr + row.to(tl.int64) * stride
    out = out_ptr + row.to(tl.int64) * V
    offs = tl.arange(0, BLOCK)
    for c in range(first, tl.minimum(first + CHUNKS, C)):
        ids = c * BLOCK + offs
        x = tl.load(base + ids, mask=ids < V, eviction_policy="evict_first").to(tl.float32)
        # Streaming stores: the output must not push rows still to be read out of L2.
        tl.store(out + ids, x - lse, mask=ids < V, cache_modifier=".cs")


@triton.jit
def _log_softmax_write_kernel(x_ptr, stride, m_ptr, z_ptr, out_ptr, V, C, BLOCK: tl.constexpr,
                              CHUNKS: tl.constexpr, CP: tl.constexpr):
    first = tl.program_id(0) * CHUNKS
    # The last rows of pass 1 are the likeliest still in L2: start with them.
    row = tl.num_programs(1) - 1 - tl.program_id(1)
    _write_log_softmax(x_ptr, stride, m_ptr, z_ptr, out_ptr, row, first, V, C, BLOCK, CHUNKS, CP)


@triton.jit
def _log_softmax_kernel(x_ptr, stride, m_ptr, z_ptr, done_ptr, out_ptr, V, C, B, P, LAG,
                        BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CP: tl.constexpr):
    # Program ids run in steps of 2P: step k first holds row k's P partial programs, then
    # row k - LAG's P writers. A writer waits for its row's partials, which only programs
    # of lower ids write, and those never wait: with blocks dispatched in id order (what
    # decoupled look-back scans rely on too) the wait always ends. LAG steps later the
    # row is still in L2, so the logits cross DRAM once, not twice.
    step = tl.program_id(0) // (2 * P)
    part = tl.program_id(0) % (2 * P)
    if part < P:
        row = step
        if row < B:
            _chunk_partials(x_ptr + row.to(tl.int64) * stride, m_ptr + row * C, z_ptr + row * C, part * CHUNKS,
                            C, V, BLOCK, CHUNKS, "evict_last")
            release(done_ptr + row)
    else:
        row = step - LAG
        if row >= 0:
            if row < B:
                wait_for(done_ptr + row, P)
                _write_log_softmax(x_ptr, stride, m_ptr, z_ptr, out_ptr, row, (part - P) * CHUNKS, V, C,
                                   BLOCK, CHUNKS, CP)


def _partial_buffers(rows: int, chunks: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (row, chunk): the max and the mass, fp32."""
    m = torch.empty((rows, chunks), dtype=torch.float32, device=device)
    return m, torch.empty_like(m)


def logsumexp(logits: torch.Tensor) -> torch.Tensor:
    x = _rows(logits)
    B, V = x.shape
    block, chunks, per_program, chunks_p2 = _layout(V)
    m, z = _partial_buffers(B, chunks, x.device)
    launch(_lse_partial_kernel, (cdiv(chunks, per_program), B), x, x.stride(0), m, z, V, chunks, BLOCK=block,
           CHUNKS=per_program, num_warps=_WARPS, enable_fp_fusion=FP_FUSION)
    out = torch.empty(B, dtype=torch.float32, device=x.device)
    launch(_lse_merge_kernel, (B,), m, z, out, chunks, CP=chunks_p2, enable_fp_fusion=FP_FUSION)
    return out


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Two launches (partials, then writers) while the logits fit in L2 anyway; past that one
    launch whose writers trail the partials by _LAG rows. The same code sums in the same
    order on both paths: identical bits."""
    x = _rows(logits)
    B, V = x.shape
    block, chunks, per_program, chunks_p2 = _layout(V)
    parts = cdiv(chunks, per_program)
    m, z = _partial_buffers(B, chunks, x.device)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    shape = dict(BLOCK=block, CHUNKS=per_program, num_warps=_WARPS, enable_fp_fusion=FP_FUSION)
    if x.numel() * (x.element_size() + out.element_size()) <= _ONE_LAUNCH_BYTES:
        launch(_lse_partial_kernel, (parts, B), x, x.stride(0), m, z, V, chunks, **shape)
        launch(_log_softmax_write_kernel, (parts, B), x, x.stride(0), m, z, out, V, chunks, CP=chunks_p2, **shape)
        return out
    done = torch.zeros(B, dtype=torch.int32, device=x.device)
    lag = _LAG.get(x.element_size(), _LAG[4])
    launch(_log_softmax_kernel, ((B + lag) * 2 * parts,), x, x.stride(0), m, z, done, out, V, chunks, B, parts, lag,
           CP=chunks_p2, **shape)
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
    parts = cdiv(chunks, per_program)
    best = torch.empty((batch, parts), dtype=torch.float32, device=x.device)
    where = torch.empty((batch, parts), dtype=torch.int32, device=x.device)
    # Rows fastest in the grid: measured 4-8% faster than splits fastest on an H100.
    launch(_argmax_partial_kernel, (batch, parts), x, x.stride(0), best, where, vocab, parts, BLOCK=block,
           CHUNKS=per_program, num_warps=_WARPS, enable_fp_fusion=FP_FUSION)
    out = torch.empty(batch, dtype=torch.int64, device=x.device)
    launch(_argmax_merge_kernel, (batch,), best, where, out, vocab, parts, PP=max(2, next_power_of_2(parts)),
           enable_fp_fusion=FP_FUSION)
    return out


# ---------------------------------------------------------------- sampler


@triton.jit
def _sample_partial_kernel(x_ptr, stride, temp_ptr, top_k_ptr, top_p_ptr, m_ptr, z_ptr, where_ptr,
                           V, C, BLOCK: tl.constexpr, EARLY: tl.constexpr):
    """One chunk of a row: the max score and, for sampled rows, the chunk's mass; for greedy
    rows, the lowest id holding the max instead."""
    let_dependents_launch(EARLY)   # the pick may launch once every program here has started
    c = tl.program_id(0)
    row = tl.program_id(1)
    greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    ids = c * BLOCK + tl.arange(0, BLOCK)
    # Unscaled -0.0 is harmless here: -0.0 and 0.0 compare equal and have the same exp.
    x = tl.load(x_ptr + row.to(tl.int64) * stride + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
    if greedy:
        top = tl.max(x, axis=0)
        tl.store(m_ptr + row * C + c, top)
        tl.store(where_ptr + row * C + c, tl.min(tl.where((ids < V) & (x == top), ids, V), axis=0))
    else:
        top, mass = chunk_mass(x * inverse)
        tl.store(m_ptr + row * C + c, top)
        tl.store(z_ptr + row * C + c, mass)


@triton.jit
def _sample_pick_kernel(x_ptr, stride, seed_ptr, step_ptr, temp_ptr, top_k_ptr, top_p_ptr, bound_ptr,
                        m_ptr, z_ptr, where_ptr, settled_ptr, out_ptr, V, C, BLOCK: tl.constexpr, CP: tl.constexpr,
                        FILTERED: tl.constexpr, PDL: tl.constexpr):
    """One program per row: the token, and the row's kept-set bounds (for tests). Greedy rows
    merge the argmax partials; sampled rows invert the CDF over the chunk partials, which for
    a top-k / top-p row sampling_filter has replaced by its kept set's (only when FILTERED:
    otherwise no row filters). Rows sampling_candidates settled already have both."""
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    greedy, inverse, top_k, top_p, k_on, p_on = row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V)
    wait_for_kernel_ahead(PDL)  # pass 1's partials
    # What every row reads, loaded before the greedy test on its parameters: one trip, not two.
    i = tl.arange(0, CP)
    m, z = load_partials(m_ptr + row * C, z_ptr + row * C, C, CP)
    where = tl.load(where_ptr + row * C + i, mask=i < C, other=V)
    if FILTERED:
        if (k_on | p_on) & (tl.load(settled_ptr + row) != 0):
            return
    base = x_ptr + row.to(tl.int64) * stride
    threshold = tl.full([], -2147483648, tl.int32)
    cut = V
    if greedy:
        token = tl.min(tl.where(m == tl.max(m, axis=0), where, V), axis=0)
    else:
        if FILTERED:
            if k_on | p_on:
                threshold = tl.load(bound_ptr + row * 2)
                cut = tl.max(tl.where(i < C, where, -1), axis=0)
        ref, w, _ = merged_mass(m, z)
        running = tl.cumsum(w, axis=0)
        # Sums of non-negative terms only grow: the last running sum is the largest.
        target = row_uniform(seed, step) * tl.max(running, axis=0)
        # The first chunk whose running mass passes the target; if rounding leaves it
        # unreached, the last chunk with any mass.
        c = tl.min(tl.where(running > target, i, CP), axis=0)
        c = tl.where(c == CP, tl.max(tl.where(w > 0.0, i, 0), axis=0), c)
        before = tl.max(tl.where(i < c, running, 0.0), axis=0)
        ids = c * BLOCK + tl.arange(0, BLOCK)
        s, valid = scaled_chunk(base, ids, V, inverse)
        e = tl.where(kept(s, ids, valid, threshold, cut), tl.exp(s - ref), 0.0)
        token = crossing(before + tl.cumsum(e, axis=0), e, ids, target, V)
    tl.store(out_ptr + row, token.to(tl.int64))
    tl.store(bound_ptr + row * 2, threshold)
    tl.store(bound_ptr + row * 2 + 1, cut)


def _pass1_registers(element_size: int) -> int | None:
    """The sampler's pass 1 register cap. For 2-byte logits, 32 (no spills on sm_90) lets 8
    programs share an SM, all its 64 warps: 1.04x at B = 256 (H100). 4-byte ones carry twice
    the bytes a program and measured 1-3% slower capped."""
    return 32 if element_size < 4 else None


def _sample(x: torch.Tensor, seeds, steps, temperature, top_k, top_p, filtered: bool):
    batch, vocab = x.shape
    device = x.device
    params = (temperature.to(device=device, dtype=torch.float32).contiguous(),
              top_k.to(device=device, dtype=torch.int32).contiguous(),
              top_p.to(device=device, dtype=torch.float32).contiguous())
    block, chunks, per_program, chunks_p2 = _layout(vocab)
    m, z = _partial_buffers(batch, chunks, device)
    where = torch.empty((batch, chunks), dtype=torch.int32, device=device)
    # Exact IEEE products and sums (no fused multiply-add), as in the torch reference.
    # A chunk a program: as fast as two at B = 256 (H100), faster below, where two leave SMs idle.
    # Unfiltered, the pick launches while pass 1's last programs run (programmatic dependent
    # launch) and waits for their stores.
    pdl = dependent_launch_options(device, on=not filtered)
    launch(_sample_partial_kernel, (chunks, batch), x, x.stride(0), *params, m, z, where, vocab, chunks,
           BLOCK=block, EARLY=pdl["PDL"], num_warps=_WARPS, maxnreg=_pass1_registers(x.element_size()),
           enable_fp_fusion=False)
    out = torch.empty(batch, dtype=torch.int64, device=device)
    bound = torch.empty((batch, 2), dtype=torch.int32, device=device)
    seeds = seeds.to(device=device, dtype=torch.int64).contiguous()
    steps = steps.to(device=device, dtype=torch.int64).contiguous()
    settled = None
    if filtered:
        settled, work = sampling_candidates.settle(x, seeds, steps, params, m, z, out, bound, block, per_program,
                                                   chunks_p2)
        sampling_filter.kept_partials(x, params, m, z, work, where, bound, block, per_program, chunks_p2)
    launch(_sample_pick_kernel, (batch,),
        x, x.stride(0), seeds, steps, *params, bound, m, z, where, settled, out, vocab, chunks,
        BLOCK=block, CP=chunks_p2, FILTERED=filtered, **pdl, num_warps=_WARPS,
        enable_fp_fusion=False)
    return out, bound, settled


def sample(logits, seeds, steps, temperature, top_k, top_p, filtered: bool) -> torch.Tensor:
    """`filtered` False promises that no row filters (kernels.sampling.row_filters): the
    top-k / top-p launches are left out, and a row that does filter is drawn unfiltered."""
    return _sample(_rows(logits), seeds, steps, temperature, top_k, top_p, filtered)[0]


def kept_bounds(logits, temperature, top_k, top_p) -> torch.Tensor:
    """int32 [B, 3]: per row the boundary key and cut id that kept() tests, and 1 where the
    candidate list settled the row, 0 where the radix select did or no filter runs (for tests)."""
    zeros = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    _, bound, settled = _sample(_rows(logits), zeros, zeros, temperature, top_k, top_p, True)
    return torch.cat([bound, settled.view(-1, 1)], dim=1)


@triton.jit
def _row_uniform_kernel(seed_ptr, step_ptr, out_ptr):
    row = tl.program_id(0)
    tl.store(out_ptr + row, row_uniform(tl.load(seed_ptr + row), tl.load(step_ptr + row)))


def row_uniforms(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The sampler's u per row, fp32 [B] (equal to philox.row_uniform_reference; exposed for tests)."""
    out = torch.empty(seeds.shape[0], dtype=torch.float32, device=seeds.device)
    launch(_row_uniform_kernel, (seeds.shape[0],), seeds.to(torch.int64).contiguous(),
           steps.to(torch.int64).contiguous(), out, enable_fp_fusion=FP_FUSION)
    return out
