"""Mixture-of-experts (Qwen3-MoE) whose every token's output is summed in one fixed order.

Two sources of batch dependence in a stock MoE layer are closed here:

- Routing. The router's logits come from the invariant matmul (the caller's kernels.matmul);
  route() takes them one token per program: softmax in fp32, the top k chosen on the logits by
  repeated maxima, a tie going to the lowest expert id, and the chosen weights normalised by
  their sum added first to last. Nothing in a row's program reads another row.
- Experts. A grouped matmul over [E, N, K] weights: a program owns BLOCK_M slots (a token's
  choice of one expert) of one expert and BLOCK_N columns, and sums each row's K from zero in
  BLOCK_K steps upward, as one accumulator (no split K). A row's sum therefore depends on its
  own activations and its expert's weights only: not on how many other tokens chose that
  expert, nor where in the block or the batch it sits, nor on BLOCK_M (on the GPU checked over
  every config by tests/kernels/test_moe.py), nor whether its step was a prefill chunk, a decode
  step or a cached prefix's continuation. gate_up's epilogue applies SiLU·up as
  kernels.silu_mul does; the down product is rounded to the model's dtype per slot, and a
  token's k slots are combined, weighted, in fp32 in rank order (its top choice first).

At a few slots (decode of a few requests) each slot is a block of its own and needs no
dispatch; above that, slots are sorted by expert (torch.sort) and one program lays out the
blocks (_align_kernel). Either way the same rows give the same bits: the layout only decides
which program computes a row.

`standard` mode runs the vendor path to measure against: torch's softmax and topk (ties as
torch breaks them), torch._grouped_mm (CUTLASS) over the sorted slots, torch's SiLU·up and a
torch combine.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.activation import silu_mul, silu_times
from kernels.launch import cdiv, launch, next_power_of_2
from kernels.matmul import BLOCK_K
from kernels.mode import get_mode, use_triton

# (BLOCK_M, BLOCK_N, num_warps, num_stages) by regime. BLOCK_K is the matmul's (kernels.matmul.
# BLOCK_K), the one constant of the summation order; the tiles only decide which program owns
# a row, and every one of them gives the same bits (tests/kernels/test_moe.py, on the GPU).
# The fastest of bench/backend_moe.py's variants on an H200 at the 30B-A3B shape (bench/results/
# backend_moe_h200.md): one token's experts 42.5 -> 33.1 us with 8 warps instead of 4, 32 tokens'
# 327.5 -> 295.6 us; 64-row tiles were slower at 32 and 256 tokens (539, 549 us).
CONFIGS = {
    "slot": (16, 64, 8, 4),     # a block per slot (decode of a few requests): weight reads only
    "small": (16, 64, 8, 4),    # sorted, few slots per expert
    "large": (64, 128, 4, 3),   # sorted, prefill: enough rows per expert for a 64-row tile
}
# At most this many slots (tokens x top k) run a block per slot: no sort, no layout launch, and
# an expert chosen twice is read twice (from L2, at this size).
SLOT_BLOCKS_MAX = 32
# Mean slots per expert from which a prefill's sorted blocks take 64 rows.
LARGE_ROWS = 48
_ALIGN_CHUNK = 64


# ---- routing -------------------------------------------------------------------------------

@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, E, stride_l,
                  TOP_K: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_TOP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    known = experts < E
    logit = tl.load(logits_ptr + row * stride_l + experts, mask=known, other=float("-inf")).to(tl.float32)
    e = tl.exp(logit - tl.max(logit, axis=0))
    prob = tl.div_rn(e, tl.sum(e, axis=0))
    rank = tl.arange(0, BLOCK_TOP)
    chosen = tl.zeros([BLOCK_TOP], dtype=tl.int32)
    weight = tl.zeros([BLOCK_TOP], dtype=tl.float32)
    total = tl.sum(tl.zeros([BLOCK_TOP], dtype=tl.float32), axis=0)
    score = logit
    for j in tl.static_range(TOP_K):
        best = tl.max(score, axis=0)
        pick = tl.min(tl.where(score == best, experts, BLOCK_E), axis=0)
        pick = tl.where(pick < E, pick, 0)   # a NaN row picks nothing: expert 0, never out of range
        p = tl.sum(tl.where(experts == pick, prob, 0.0), axis=0)
        chosen = tl.where(rank == j, pick, chosen)
        weight = tl.where(rank == j, p, weight)
        total += p   # first to last: the one order of the normalising sum
        score = tl.where(experts == pick, float("-inf"), score)
    if NORMALIZE:
        weight = tl.div_rn(weight, tl.zeros_like(weight) + total)
    out = row * TOP_K + rank
    tl.store(ids_ptr + out, chosen, mask=rank < TOP_K)
    tl.store(weights_ptr + out, weight, mask=rank < TOP_K)


def route_reference(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """route() in plain torch: the same choices (a stable sort keeps the lowest id first among
    ties) and the same order of the normalising sum."""
    scores = logits.float()
    prob = scores.softmax(-1)
    ids = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = prob.gather(1, ids)
    if normalize:
        total = weights[:, 0].clone()
        for j in range(1, top_k):
            total += weights[:, j]
        weights = weights / total[:, None]
    return weights, ids.to(torch.int32)


def _route_standard(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = torch.topk(logits.float().softmax(-1), top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids.to(torch.int32)


def route(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, top_k] fp32, expert ids [T, top_k] int32), best first: the
    softmax's probabilities of the top_k largest logits (ties to the lowest id), divided by their
    sum where `normalize` (norm_topk_prob)."""
    t, e = logits.shape
    if not 0 < top_k <= e:
        raise ValueError(f"top_k must be in 1..{e}, got {top_k}")
    if not use_triton(logits):
        if get_mode() == "standard":
            return _route_standard(logits, top_k, normalize)
        return route_reference(logits, top_k, normalize)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    if t:
        launch(_route_kernel, (t,), logits, weights, ids, e, logits.stride(0),
               TOP_K=top_k, NORMALIZE=normalize, BLOCK_E=next_power_of_2(e), BLOCK_TOP=next_power_of_2(top_k),
               num_warps=4, enable_fp_fusion=False)
    return weights, ids


# ---- dispatch: slots sorted by expert, in blocks of BLOCK_M ----------------------------------

@triton.jit
def _align_kernel(sorted_ptr, order_ptr, rows_ptr, experts_ptr, scratch_ptr, SLOTS, E, BLOCKS,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """One program: the sorted slots laid out in blocks of BLOCK_M, each expert's starting at a
    block boundary (rows_ptr; SLOTS marks a padding row), and each block's expert (experts_ptr;
    -1 past the last)."""
    e = tl.arange(0, BLOCK_E)
    known = e < E
    below = tl.zeros([BLOCK_E], dtype=tl.int32)   # slots of a lower expert: where e's start
    count = tl.zeros([BLOCK_E], dtype=tl.int32)
    for c in range(0, SLOTS, CHUNK):
        i = c + tl.arange(0, CHUNK)
        ids = tl.load(sorted_ptr + i, mask=i < SLOTS, other=BLOCK_E)
        below += tl.sum((ids[:, None] < e[None, :]).to(tl.int32), axis=0)
        count += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), axis=0)
    padded = (count + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    tl.store(scratch_ptr + e, below, mask=known)
    tl.store(scratch_ptr + BLOCK_E + e, padded_end - padded, mask=known)
    for c in range(0, BLOCKS * BLOCK_M, CHUNK):
        i = c + tl.arange(0, CHUNK)
        tl.store(rows_ptr + i, tl.zeros([CHUNK], dtype=tl.int32) + SLOTS, mask=i < BLOCKS * BLOCK_M)
    tl.debug_barrier()   # the starts and the padding written before any thread reads or overwrites them
    for c in range(0, SLOTS, CHUNK):
        i = c + tl.arange(0, CHUNK)
        inside = i < SLOTS
        ids = tl.load(sorted_ptr + i, mask=inside, other=0)
        start = tl.load(scratch_ptr + ids, mask=inside, other=0)
        padded_start = tl.load(scratch_ptr + BLOCK_E + ids, mask=inside, other=0)
        slot = tl.load(order_ptr + i, mask=inside, other=0).to(tl.int32)
        tl.store(rows_ptr + padded_start + i - start, slot, mask=inside)
    for c in range(0, BLOCKS, CHUNK):
        b = c + tl.arange(0, CHUNK)
        # The block's expert: the first whose padded range ends past the block's first row.
        ends_before = (padded_end[None, :] <= (b * BLOCK_M)[:, None]) & known[None, :]
        expert = tl.sum(ends_before.to(tl.int32), axis=1)
        tl.store(experts_ptr + b, tl.where(expert < E, expert, -1), mask=b < BLOCKS)


def _block_bound(slots: int, experts: int, block_m: int) -> int:
    """The most blocks `slots` slots can fill: each expert used pads its last block."""
    return cdiv(slots + min(experts, slots) * (block_m - 1), block_m)


def _align(ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [blocks * block_m] int32: the slot of each block row, or slots for padding; the
    expert of each block [blocks] int32, -1 for an unused one). Static shapes: graph-capturable."""
    flat = ids.reshape(-1)
    slots = flat.numel()
    sorted_ids, order = torch.sort(flat, stable=True)
    blocks = _block_bound(slots, experts, block_m)
    rows = torch.empty(blocks * block_m, dtype=torch.int32, device=ids.device)
    block_experts = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    block_e = next_power_of_2(experts)
    scratch = torch.empty(2 * block_e, dtype=torch.int32, device=ids.device)
    launch(_align_kernel, (1,), sorted_ids, order, rows, block_experts, scratch, slots, experts, blocks,
           BLOCK_M=block_m, BLOCK_E=block_e, CHUNK=_ALIGN_CHUNK, num_warps=4, enable_fp_fusion=False)
    return rows, block_experts


# ---- the grouped matmul ----------------------------------------------------------------------

@triton.jit
def _experts_kernel(a_ptr, w_ptr, out_ptr, rows_ptr, experts_ptr,
                    SLOTS, N, K, stride_am, stride_we, stride_wn, stride_wk, stride_om,
                    A_DIV: tl.constexpr, SORTED: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr,
                    IEEE: tl.constexpr, LIBDEVICE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[slot] = a[slot // A_DIV] @ w[expert of slot]^T for the slots of block program_id(0),
    columns program_id(1). SORTED: the block's rows and expert from _align_kernel; else the block
    is slot program_id(0) alone, its expert experts_ptr[slot]. GATED: w = [gate | up] along N, and
    out gets SiLU·up (N / 2 columns)."""
    block = tl.program_id(0)
    pid_n = tl.program_id(1)
    if SORTED:
        expert = tl.load(experts_ptr + block)
        if expert < 0:
            return
        slot = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = slot < SLOTS
    else:
        expert = tl.load(experts_ptr + block)
        slot = block + tl.arange(0, BLOCK_M)
        valid = tl.arange(0, BLOCK_M) == 0
    # Padding rows read row 0 again instead of being masked (never stored), as kernels.matmul does.
    a_rows = tl.where(valid, slot // A_DIV, 0).to(tl.int64)
    if GATED:
        HALF: tl.constexpr = BLOCK_N // 2
        j = tl.arange(0, BLOCK_N)
        cols = pid_n * HALF + j % HALF + tl.where(j < HALF, 0, N // 2)
    else:
        cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + cols[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    out_rows = slot.to(tl.int64)
    if GATED:
        h = tl.permute(tl.reshape(acc.to(out_ptr.dtype.element_ty), (BLOCK_M, 2, HALF)), (0, 2, 1))
        gate, up = tl.split(h)
        out_n = pid_n * HALF + tl.arange(0, HALF)
        tl.store(out_ptr + out_rows[:, None] * stride_om + out_n[None, :], silu_times(gate, up, LIBDEVICE),
                 mask=valid[:, None] & (out_n[None, :] < N // 2))
    else:
        out_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out_ptr + out_rows[:, None] * stride_om + out_n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=valid[:, None] & (out_n[None, :] < N))


@triton.jit
def _combine_kernel(y_ptr, w_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum over j of w[t, j] * y[t * TOP_K + j], in fp32, j = 0 first; one rounding."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        w = tl.load(w_ptr + t * TOP_K + j)
        acc += w * tl.load(y_ptr + (t * TOP_K + j) * H + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _config(slots: int, experts: int, device: torch.device) -> tuple[str, tuple[int, int, int, int]]:
    if device.type != "cuda":
        # The interpreter's dot rounds by block shape (kernels.matmul._config): one tile there.
        return ("slot" if slots <= SLOT_BLOCKS_MAX else "sorted"), (16, 32, 4, 1)
    if slots <= SLOT_BLOCKS_MAX:
        return "slot", CONFIGS["slot"]
    return "sorted", CONFIGS["large" if slots >= LARGE_ROWS * experts else "small"]


def _experts_triton(x, weights, ids, gate_up, down, config=None):
    t, h = x.shape
    top_k = ids.shape[1]
    experts, two_i, _ = gate_up.shape
    inter = two_i // 2
    if inter % 16:
        raise ValueError(f"the Triton experts take an intermediate size that is a multiple of 16, not {inter}")
    slots = t * top_k
    layout, (block_m, block_n, warps, stages) = config or _config(slots, experts, x.device)
    while inter % (block_n // 2) and block_n > 32:   # gate_up's tiles pair I / 2 gate with as many up columns
        block_n //= 2
    if layout == "slot":
        rows, block_experts, blocks = ids, ids, slots   # the kernel reads a slot's expert from ids
    else:
        rows, block_experts = _align(ids, experts, block_m)
        blocks = block_experts.numel()
    dtype = x.dtype
    common = dict(SORTED=layout != "slot", IEEE=dtype == torch.float32, LIBDEVICE=x.is_cuda,
                  BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K[dtype], num_warps=warps, num_stages=stages,
                  enable_fp_fusion=False)
    act = torch.empty(slots, inter, dtype=dtype, device=x.device)
    launch(_experts_kernel, (blocks, cdiv(two_i, block_n)), x, gate_up, act, rows, block_experts,
           slots, two_i, h, x.stride(0), *gate_up.stride(), act.stride(0),
           A_DIV=top_k, GATED=True, EVEN_K=h % BLOCK_K[dtype] == 0, **common)
    y = torch.empty(slots, h, dtype=dtype, device=x.device)
    launch(_experts_kernel, (blocks, cdiv(h, block_n)), act, down, y, rows, block_experts,
           slots, h, inter, act.stride(0), *down.stride(), y.stride(0),
           A_DIV=1, GATED=False, EVEN_K=inter % BLOCK_K[dtype] == 0, **common)
    out = torch.empty(t, h, dtype=dtype, device=x.device)
    block = min(1024, next_power_of_2(h))
    launch(_combine_kernel, (t, cdiv(h, block)), y, weights, out, h, TOP_K=top_k, BLOCK=block,
           num_warps=4, enable_fp_fusion=False)
    return out


def combine_reference(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """y [T * k, H], weights [T, k] -> [T, H]: _combine_kernel's products and additions in torch."""
    t, k = weights.shape
    y = y.view(t, k, -1).float()
    acc = torch.zeros_like(y[:, 0])
    for j in range(k):
        acc += weights[:, j, None] * y[:, j]
    return acc


def experts_reference(x, weights, ids, gate_up, down):
    """Plain torch: each expert's tokens through its SwiGLU in fp32 (one rounding per product, as
    the kernel), then the weighted combine in rank order."""
    t, h = x.shape
    top_k = ids.shape[1]
    flat = ids.reshape(-1).long()
    y = torch.empty(t * top_k, h, dtype=x.dtype, device=x.device)
    for e in torch.unique(flat).tolist():
        slots = (flat == e).nonzero().squeeze(1)
        a = x[slots // top_k].float()
        act = silu_mul((a @ gate_up[e].float().t()).to(x.dtype))
        y[slots] = (act.float() @ down[e].float().t()).to(x.dtype)
    return combine_reference(y, weights).to(x.dtype)


def _experts_standard(x, weights, ids, gate_up, down):
    """The vendor path: the slots sorted by expert through torch._grouped_mm (sm_90's CUTLASS
    grouped GEMM) where it runs, else a loop over the experts."""
    if not (x.is_cuda and hasattr(torch, "_grouped_mm") and x.dtype == torch.bfloat16):
        return experts_reference(x, weights, ids, gate_up, down)
    t, h = x.shape
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    sorted_ids, order = torch.sort(flat)
    ends = torch.searchsorted(sorted_ids, torch.arange(gate_up.shape[0], device=x.device, dtype=sorted_ids.dtype),
                              right=True).to(torch.int32)
    a = x.index_select(0, order // top_k)
    act = torch._grouped_mm(a, gate_up.transpose(1, 2), offs=ends)
    gate, up = act.chunk(2, dim=-1)
    y_sorted = torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=ends)
    y = torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)
    return (y.view(t, top_k, h).float() * weights[..., None]).sum(1).to(x.dtype)


def experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
            down: torch.Tensor) -> torch.Tensor:
    """x [T, H], route()'s weights and ids [T, k], gate_up [E, 2I, H] (each expert's [gate | up]
    projection as the checkpoint stores it, rows = outputs), down [E, H, I] -> [T, H] in x's dtype:
    sum over j of weights[:, j] * expert ids[:, j]'s SwiGLU of x."""
    _check(x, weights, ids, gate_up, down)
    if use_triton(x, gate_up, down):
        return _experts_triton(x, weights, ids, gate_up, down)
    if get_mode() == "standard":
        return _experts_standard(x, weights, ids, gate_up, down)
    return experts_reference(x, weights, ids, gate_up, down)


def _check(x, weights, ids, gate_up, down) -> None:
    t, h = x.shape
    e, two_i, gh = gate_up.shape
    if gh != h or two_i % 2 or tuple(down.shape) != (e, h, two_i // 2):
        raise ValueError(f"gate_up must be [E, 2I, {h}] and down [E, {h}, I], got {tuple(gate_up.shape)} and "
                         f"{tuple(down.shape)}")
    if ids.shape != weights.shape or ids.shape[0] != t:
        raise ValueError(f"weights and ids must both be [{t}, k], got {tuple(weights.shape)} and {tuple(ids.shape)}")
    if x.stride(1) != 1 or gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("x, gate_up and down must be contiguous along their last dimension")
