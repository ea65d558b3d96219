"""Batch-invariant matmul: C = A @ B (+ bias), fp32 accumulation, split-K by a fixed rule.

Why it is invariant: K is cut into segments of whole BLOCK_K steps, and how many
depends on K and N only (k_segments). Each segment is summed from zero, walking
its steps upward as `part = dot(a_tile, b_tile, part)` on the tensor cores, and
the segments' sums are then added in order, first to last. Neither BLOCK_K, nor
the segments, nor either order depends on M, so row i of C gets the same
sequence of roundings whether it is computed alone or inside a batch of 8192
rows. A large batch sums the segments inside one program; a decode step or a
batch of up to 128 rows, whose tiles alone leave most SMs idle, gives each
segment its own program, and the last of a tile's programs to finish adds their
fp32 sums: the same additions in the same order, in one launch. Or the kernel
that reads the product adds them (matmul_partials, kernels/partials.py), in the
same order again.

The M and N tile sizes do vary with the shape, for speed: they only decide
which program owns an element, not how it is summed. That this holds on the
hardware is measured, not assumed: a 16-row tile runs on mma.sync, a 64- or
128-row tile on Hopper's wgmma, and a different instruction could in principle
round differently. On an H100 every config in bench/kernels_dense.py's sweep
(BLOCK_M 16..128, BLOCK_N 32..256, both kernels below) gave identical bits,
and tests/kernels/test_matmul.py checks the ones used here, split or not.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.activation import silu_mul, silu_times
from kernels.device import DECODE_ROWS, dependent_launch_options, sm_count, wait_for_kernel_ahead
from kernels.launch import Launch, cdiv, launch
from kernels.mode import get_mode, use_triton
from kernels.partials import Partials
from kernels.toolchain import FP_FUSION

# These constants fix the summation order over K. Changing one changes the bits
# of outputs, so they are part of the kernel version.
BLOCK_K = {torch.bfloat16: 64, torch.float16: 64, torch.float32: 32}
# Segments are sized so that a one-row product would reach about _SPLIT_PROGRAMS programs of
# _SPLIT_BLOCK_N columns (a unit of the rule, whatever tile runs), with at least
# _MIN_SEGMENT_STEPS steps each (a segment boundary drains a large tile's load pipeline, so
# prefill must not see many).
_SPLIT_PROGRAMS = 512
_SPLIT_BLOCK_N = 32
_MIN_SEGMENT_STEPS = 8

# (BLOCK_M, BLOCK_N, num_warps, num_stages, kernel): for each regime the fastest config
# measured: large, wide and medium from the H100 sweep (bench/results/kernels_dense_sweep.json),
# the split and decode tiles from the benchmarks their comments name. "tma" falls back to
# "pointer" when the operands' strides do not suit the copy engine.
CONFIGS = {
    "large": (128, 256, 8, 3, "tma"),     # enough 128x256 tiles to fill the GPU: on par with cuBLAS
    "wide": (128, 128, 8, 4, "tma"),      # enough 128x128 tiles to fill it
    "medium": (64, 128, 4, 5, "tma"),     # mid M, or wide N at decode
    # 17..128 rows whose TMA tiles would not fill the GPU: 64-row tiles, a program per (tile, K
    # segment), as wide as still gives it enough programs (_batch_split). The 64x32 pointer tiles
    # before summed every segment in one program (bench/results/kernels_batch_split.md).
    "split128": (64, 128, 4, 4, "split"),
    "split64": (64, 64, 4, 4, "split"),
    "split32": (64, 32, 4, 4, "split"),
    # Decode, 1..8 rows, where the weight read is all the cost: a program per (tile, K
    # segment); with one segment, the pointer kernel. Over a layer's four matmuls the fastest
    # of the sweep, 3-5% ahead of 4 warps (bench/results/kernels_decode_options.md).
    "decode": (DECODE_ROWS, 64, 8, 4, "split"),
    # The same rows over small weights whose K splits (the 0.6B qkv, o and down projections):
    # fewer warps, more loads in flight. One 0.6B request +1.8% on an H100, the GPU step 1,158 ->
    # 1,138 us (bench/results/backend_decode_stages_ab.md). SiLU·up's fused (gated) matmul keeps
    # "decode": 8.5 against 9.4 us at one row.
    "decode_small": (DECODE_ROWS, 64, 4, 6, "split"),
    # 9..16 rows: twice the programs, each with fewer warps and more loads in flight
    # (bench/results/kernels_batch_split.md).
    "decode16": (DECODE_ROWS, 32, 2, 8, "split"),
}
_GROUP_M = 8
# Small decode weights: a decode matmul over at most this many bytes is latency-bound. It gains from
# launching while the kernel ahead of it still runs (launches_early): on an H200, one 0.6B request
# (weights of 4-13 MB a matmul) +5%, one 8B request (33-235 MB) -5% (bench/results/
# backend_early_launch_ab.md). Where its K splits it runs the "decode_small" tile.
_SMALL_WEIGHT_BYTES = 16 << 20
# One 128x256 tile's time over two 128x128 tiles', H100 under sustained load (clocks held
# down by the power cap, as in serving): 0.92-0.94 at K=4096/14336, N=4096/14336, M=2048-8192.
_LARGE_TILE_TIME = 0.93


def k_segments(k: int, n: int, dtype: torch.dtype) -> tuple[int, int]:
    """(segments, BLOCK_K steps per segment) of a [*, k] @ [k, n] product; the last may be shorter.
    An empty K has no segments, and an empty N splits as one column would."""
    # The rule's constants are read per call (benchmarks and tests vary them); the arithmetic is kept.
    return _segments(k, n, BLOCK_K[dtype], _SPLIT_PROGRAMS, _SPLIT_BLOCK_N, _MIN_SEGMENT_STEPS)


@functools.lru_cache(maxsize=4096)
def _segments(k: int, n: int, block_k: int, programs: int, block_n: int, min_steps: int) -> tuple[int, int]:
    steps = cdiv(k, block_k)
    wanted = programs // max(1, cdiv(n, block_n))
    per = max(1, cdiv(steps, max(1, min(wanted, steps // min_steps))))
    return cdiv(steps, per), per


def _config(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, segments: int,
            gated: bool = False) -> tuple[int, int, int, int, str]:
    """Pick tiles that give every SM work; decode wants many thin N tiles, and a
    program per K segment (k_segments: `segments` of them) where N alone gives too few.
    gated: swiglu's product, whose SiLU·up epilogue runs in the last program."""
    if device.type != "cuda" or dtype == torch.float32:
        # The interpreter's dot is a numpy BLAS call whose rounding depends on
        # the block shape, so there one shape serves every M. fp32 is not a
        # serving dtype: one config whose fp32 tiles fit in shared memory.
        return CONFIGS["medium"]
    if m <= DECODE_ROWS:
        if m > DECODE_ROWS // 2:
            return CONFIGS["decode16"]
        small = not gated and segments > 1 and _small_weights(k, n, dtype)
        return CONFIGS["decode_small"] if small else CONFIGS["decode"]
    sms = sm_count(device)
    fill = 0.8 * sms
    if m <= 64:
        if cdiv(n, 128) >= fill:
            return CONFIGS["medium"]
        return _batch_split(m, n, segments, fill)
    large, wide = cdiv(m, 128) * cdiv(n, 256), cdiv(m, 128) * cdiv(n, 128)
    if large >= fill:
        # Waves of one tile per SM: a 128x256 tile does two 128x128 tiles' work in
        # _LARGE_TILE_TIME of their time, but where its last wave is mostly empty the
        # finer tiles finish first (K=4096, N=14336, M=1024: 448 large tiles are 3.4 waves).
        if cdiv(wide, sms) < 2 * _LARGE_TILE_TIME * cdiv(large, sms):
            return CONFIGS["wide"]
        return CONFIGS["large"]
    if wide >= fill:
        return CONFIGS["wide"]
    if m <= 128:
        return _batch_split(m, n, segments, fill)
    return CONFIGS["medium"]


def _batch_split(m: int, n: int, segments: int, fill: float) -> tuple[int, int, int, int, str]:
    """The widest split tile whose programs, a (tile, K segment) each, reach `fill`; else the narrowest."""
    for name in ("split128", "split64"):
        block_m, block_n = CONFIGS[name][:2]
        if cdiv(m, block_m) * cdiv(n, block_n) * segments >= fill:
            return CONFIGS[name]
    return CONFIGS["split32"]


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, parts_ptr, counts_ptr,
    M, N, K, SEGMENTS, SEGMENT_STEPS,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, PARTIAL: tl.constexpr,
    GATED: tl.constexpr, LIBDEVICE: tl.constexpr, LAST_ADDS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_kernel_ahead(PDL)
    # Grouped launch order so that consecutive programs share B tiles in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_m = (pid // pids_per_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows/columns read a valid row/column again instead of being
    # masked: they are never stored, and unmasked loads keep the pipeline simple.
    rows = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    if GATED:
        # b = [gate | up]: the tile's first half reads gate columns, its second half the same
        # columns of up, so that its epilogue pairs them (the wrapper makes N / 2 a multiple of
        # BLOCK_N / 2). offs_n still numbers the tile's columns, for the split workspace.
        HALF: tl.constexpr = BLOCK_N // 2
        j = tl.arange(0, BLOCK_N)
        cols = pid_n * HALF + j % HALF + tl.where(j < HALF, 0, N // 2)
        cols = tl.max_contiguous(tl.multiple_of(cols, HALF), HALF)
    else:
        cols = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_first = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_first = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn

    # PARTIAL: this program sums only the segment its second grid index names, into
    # parts_ptr, a [SEGMENTS, M, N] fp32 workspace. LAST_ADDS: the tile's last program to finish
    # adds them; else the kernel reading the product does (kernels.partials).
    if PARTIAL:
        first_segment = tl.program_id(1)
        last_segment = first_segment + 1
    else:
        first_segment = 0
        last_segment = SEGMENTS
    steps = tl.cdiv(K, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for segment in range(first_segment, last_segment):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        first_step = segment * SEGMENT_STEPS
        a_ptrs = a_first + first_step.to(tl.int64) * BLOCK_K * stride_ak
        b_ptrs = b_first + first_step.to(tl.int64) * BLOCK_K * stride_bk
        for k in range(first_step, tl.minimum(first_step + SEGMENT_STEPS, steps)):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                k_left = K - k * BLOCK_K
                a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if IEEE:
                part = tl.dot(a, b, part, input_precision="ieee")
            else:
                part = tl.dot(a, b, part)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc += part

    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if PARTIAL:
        tile = offs_m[:, None] * N + offs_n[None, :]
        tl.store(parts_ptr + first_segment.to(tl.int64) * M * N + tile, acc, mask=mask)
        if LAST_ADDS:
            # Every thread's store before the count (barrier, then release), and the others'
            # partials read after it (acquire; .cg reads L2, where the other SMs wrote).
            tl.debug_barrier()
            if tl.atomic_add(counts_ptr + pid, 1, sem="acq_rel") == SEGMENTS - 1:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                parts = parts_ptr + tile
                for _ in range(0, SEGMENTS):   # the one-program `acc += part`, in order
                    acc += tl.load(parts, mask=mask, other=0.0, cache_modifier=".cg")
                    parts += M * N
                tl.store(counts_ptr + pid, 0)   # ready for the next call, or the next graph replay
                _finish(acc, bias_ptr, c_ptr, offs_m, offs_n, cols, mask, M, N, pid_n, stride_cm, stride_cn,
                        HAS_BIAS, GATED, LIBDEVICE, BLOCK_M, BLOCK_N)
    else:
        _finish(acc, bias_ptr, c_ptr, offs_m, offs_n, cols, mask, M, N, pid_n, stride_cm, stride_cn, HAS_BIAS,
                GATED, LIBDEVICE, BLOCK_M, BLOCK_N)


@triton.jit
def _finish(acc, bias_ptr, c_ptr, offs_m, offs_n, cols, mask, M, N, pid_n, stride_cm, stride_cn,
            HAS_BIAS: tl.constexpr, GATED: tl.constexpr, LIBDEVICE: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if GATED:
        # Rounded to the output dtype first, as the matmul's output is, then SiLU·up's roundings:
        # silu_mul(matmul(a, b))'s bits, each product computed once.
        HALF: tl.constexpr = BLOCK_N // 2
        h = tl.permute(tl.reshape(acc.to(c_ptr.dtype.element_ty), (BLOCK_M, 2, HALF)), (0, 2, 1))
        gate, up = tl.split(h)
        out_n = pid_n * HALF + tl.arange(0, HALF)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + out_n[None, :] * stride_cn, silu_times(gate, up, LIBDEVICE),
                 mask=(offs_m[:, None] < M) & (out_n[None, :] < N // 2))
        return
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _matmul_tma_kernel(
    a_desc, b_desc, c_desc, bias_ptr,
    M, N, K, SEGMENTS, SEGMENT_STEPS,
    HAS_BIAS: tl.constexpr, B_KMAJOR: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_kernel_ahead(PDL)
    # Persistent: program p walks tiles p, p + num_programs, ...;
    # every tile still sums K in the same fixed order. The copy engine fills
    # out-of-range rows and the K tail with zeros and clips the store.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    steps = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        first_m = (tile // pids_per_group) * GROUP_M
        group_rows = min(num_pid_m - first_m, GROUP_M)
        off_m = (first_m + (tile % pids_per_group) % group_rows) * BLOCK_M
        off_n = ((tile % pids_per_group) // group_rows) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for segment in range(0, SEGMENTS):
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(segment * SEGMENT_STEPS, tl.minimum((segment + 1) * SEGMENT_STEPS, steps)):
                a = a_desc.load([off_m, k * BLOCK_K])
                if B_KMAJOR:
                    b = b_desc.load([off_n, k * BLOCK_K]).T
                else:
                    b = b_desc.load([k * BLOCK_K, off_n])
                if IEEE:
                    part = tl.dot(a, b, part, input_precision="ieee")
                else:
                    part = tl.dot(a, b, part)
            acc += part
        if HAS_BIAS:
            cols = off_n + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def _check(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul takes 2-D a and b, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in BLOCK_K:
        raise ValueError(f"a and b must share one of {list(BLOCK_K)}, got {a.dtype} and {b.dtype}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != b.shape[1]):
        raise ValueError(f"bias must be [N={b.shape[1]}], got {tuple(bias.shape)}")


def matmul_reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch, fp32 accumulation, one rounding to a's dtype at the end."""
    _check(a, b, bias)
    return _matmul_torch(a, b, bias)


def _matmul_torch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # The CPU backend makes 121 of these calls a token, each a few us of dispatch: fp32
    # operands skip the casts (a no-op cast still costs its call).
    dtype = a.dtype
    if dtype != torch.float32:
        a, b = a.float(), b.float()
    out = a @ b
    if bias is not None:
        out += bias.float()
    return out if dtype == torch.float32 else out.to(dtype)


def _matmul_standard(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return torch.mm(a, b)
    return torch.addmm(bias.to(a.dtype), a, b)


def _tma_ready(t: torch.Tensor) -> bool:
    """The copy engine needs a 16-byte aligned base, one unit stride and 16-byte aligned other stride."""
    es = t.element_size()
    if t.data_ptr() % 16:
        return False
    return (t.stride(1) == 1 and t.stride(0) * es % 16 == 0) or (t.stride(0) == 1 and t.stride(1) * es % 16 == 0)


def _programs(device: torch.device, tiles: int) -> int:
    # The interpreter runs programs one after another; a few suffice.
    return min(tiles, sm_count(device) if device.type == "cuda" else 4)


def _launch_tma(a, b, bias, c, segments, block_m, block_n, block_k, warps, stages):
    M, K = a.shape
    N = b.shape[1]
    b_kmajor = b.stride(0) == 1 and b.stride(1) != 1
    a_desc = TensorDescriptor(a, [M, K], [a.stride(0), 1], [block_m, block_k])
    if b_kmajor:
        b_desc = TensorDescriptor(b, [N, K], [b.stride(1), 1], [block_n, block_k])
    else:
        b_desc = TensorDescriptor(b, [K, N], [b.stride(0), 1], [block_k, block_n])
    c_desc = TensorDescriptor(c, [M, N], [c.stride(0), 1], [block_m, block_n])
    tiles = cdiv(M, block_m) * cdiv(N, block_n)
    launch(_matmul_tma_kernel, (_programs(a.device, tiles),),
        a_desc, b_desc, c_desc, bias if bias is not None else c,
        M, N, K, *segments,
        HAS_BIAS=bias is not None, B_KMAJOR=b_kmajor, IEEE=a.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=_GROUP_M,
        **dependent_launch_options(a.device),
        num_warps=warps, num_stages=stages, enable_fp_fusion=FP_FUSION,
    )


@functools.lru_cache(maxsize=4096, typed=True)   # typed: as Triton compiles 1 and True apart
def _pointer_launch(M, N, K, dtype, device, a_strides, b_strides, c_strides, segments, block_m, block_n, block_k,
                    warps, stages, has_bias, partial, last_adds, gated) -> Launch:
    # Eager calls repeat a model's few shapes: everything but the tensors is worked out once.
    return Launch(
        _matmul_kernel, (cdiv(M, block_m) * cdiv(N, block_n), segments[0] if partial else 1),
        (M, N, K, *segments, *a_strides, *b_strides, *c_strides),
        HAS_BIAS=has_bias, EVEN_K=K % block_k == 0, IEEE=dtype == torch.float32,
        PARTIAL=partial, GATED=gated, LIBDEVICE=device.type == "cuda", LAST_ADDS=last_adds,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=_GROUP_M,
        **dependent_launch_options(device),
        # The SiLU·up epilogue keeps its roundings apart, as silu_mul's kernel does; the
        # matmul itself has no product to fuse an addition into (tl.dot accumulates).
        num_warps=warps, num_stages=stages, enable_fp_fusion=FP_FUSION and not gated,
    )


# Per device, one arrival count per tile of a split launch, left at zero by every launch. Two
# split launches running at once on different streams would share them: the engine runs one.
_counts: dict[torch.device, torch.Tensor] = {}


def _tile_counts(device: torch.device, tiles: int) -> torch.Tensor:
    counts = _counts.get(device)
    if counts is None or counts.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Zeros written during capture would exist only once the graph replays.
            raise RuntimeError("run a split matmul of this size once before capturing it in a CUDA graph")
        counts = _counts[device] = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
    return counts


def _matmul_triton(a, b, bias, config=None, gated=False, unsummed=False):
    """`config` overrides the dispatch: swiglu's choice (_swiglu_config), the benchmark's sweep and
    the tests that check every config gives the same bits. gated: swiglu's product, by the pointer
    or split kernel. unsummed: a split launch without a bias returns its segments' sums
    (matmul_partials)."""
    M, K = a.shape
    N = b.shape[1]
    c_shape = (M, N // 2 if gated else N)
    device = a.device
    if M == 0 or N == 0 or K == 0:   # nothing to sum: the bias, or zeros (swiglu's silu(0) * 0)
        c = torch.zeros(c_shape, dtype=a.dtype, device=device)
        return c.copy_(bias.expand(M, N)) if bias is not None else c
    segments = k_segments(K, N, a.dtype)
    block_m, block_n, warps, stages, kernel = config or _config(M, N, K, a.dtype, device, segments[0])
    # Split: a program per (tile, K segment), summing into a [segments, M, N] workspace (PARTIAL in
    # _matmul_kernel). The tile's last program to finish adds the segments into c; or, unsummed,
    # nothing adds them and the product's reader does (matmul_partials): c is then not written.
    split = kernel == "split" and segments[0] > 1
    partials = unsummed and split and bias is None and not gated
    parts = a.new_empty((segments[0], M, N), dtype=torch.float32) if split else None
    c = parts[0] if partials else a.new_empty(c_shape)
    if (kernel == "tma" and not gated and a.stride(1) == 1 and _tma_ready(a) and _tma_ready(b)
            and _tma_ready(c)):
        _launch_tma(a, b, bias, c, segments, block_m, block_n, BLOCK_K[a.dtype], warps, stages)
        return c
    last_adds = split and not partials
    bound = _pointer_launch(M, N, K, a.dtype, device, a.stride(), b.stride(), c.stride(), segments, block_m, block_n,
                            BLOCK_K[a.dtype], warps, stages, bias is not None, split, last_adds, gated)
    bound(a, b, bias if bias is not None else c, c, parts if split else c,
          _tile_counts(device, bound.grid[0]) if last_adds else c)
    return Partials(parts, a.dtype) if partials else c


def _swiglu_config(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int, int, str] | None:
    """The dispatch's config where swiglu runs as one launch: on the GPU, where the split kernel runs
    (its tiles pair N / 2 gate columns with as many up columns). None elsewhere: large batches keep
    the vendor-speed TMA kernel and a SiLU·up launch."""
    if not a.is_cuda:
        return None
    (m, k), n = a.shape, b.shape[1]
    config = _config(m, n, k, a.dtype, a.device, k_segments(k, n, a.dtype)[0], gated=True)
    return config if config[4] == "split" and (n // 2) % (config[1] // 2) == 0 else None


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a: [M, K], b = [gate | up]: [K, 2I] -> silu(a @ gate) * (a @ up): [M, I], in a's dtype, with
    silu_mul(matmul(a, b))'s bits in both kernel modes. Where the split kernel runs on the GPU (decode,
    batches to 128 rows) one launch: the matmul's epilogue computes each output once, and no [M, 2I]
    intermediate is written.

    It never lets the matmul behind it launch early, as the norm does: triggered from a matmul,
    the early launch cost one row's 0.6B MLP 13.1 -> 21.5 us (bench/results/kernels_swiglu.md)."""
    _check(a, b, None)
    if b.shape[1] % 2:
        raise ValueError(f"b must be [gate | up] with an even number of columns, got {tuple(b.shape)}")
    config = _swiglu_config(a, b) if use_triton(a, b) else None
    if config is not None:
        return _matmul_triton(a, b, None, config, gated=True)
    return silu_mul(matmul(a, b))


def launches_early(b: torch.Tensor) -> bool:
    """Whether the kernel ahead of a decode matmul over weights b should let it launch at that
    kernel's top (the `early` of rms_norm_residual and paged_attention)."""
    return _small_weights(*b.shape, b.dtype)


def _small_weights(k: int, n: int, dtype: torch.dtype) -> bool:
    return k * n * dtype.itemsize <= _SMALL_WEIGHT_BYTES


def matmul_partials(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | Partials:
    """matmul(a, b, bias) for a kernel that reads the product through kernels.partials.load_product
    (rms_norm_residual, rope_store_kv): where a launch splits K over programs (decode, and batches
    of up to 128 rows) and there is no bias, the segments' sums, for that kernel to add; elsewhere
    the product."""
    return _product(a, b, bias, unsummed=True)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a: [M, K], b: [K, N], bias: [N] or None -> [M, N] in a's dtype.

    In invariant mode row i of the result has the same bits for every M and
    whatever the other rows hold. b may have any strides. Fastest: a
    contiguous a, and b either an nn.Linear weight [N, K] passed as
    `weight.t()` or a contiguous [K, N] (the two run at the same speed and give
    the same bits), with rows 16-byte aligned so that the copy-engine (TMA)
    kernel runs; other strides take a slower pointer-based kernel.
    """
    return _product(a, b, bias)


def _product(a, b, bias, unsummed=False):
    _check(a, b, bias)
    if use_triton(a, b, *([bias] if bias is not None else [])):
        return _matmul_triton(a, b, bias, unsummed=unsummed)
    if get_mode() == "standard":
        return _matmul_standard(a, b, bias)
    return _matmul_torch(a, b, bias)
