"""Batch-invariant paged attention and KV-cache writes in Triton.

Why a row's bits depend only on its own query and its own sequence's KV:
- Every program holds exactly BLOCK_M query rows, (position, head) pairs of one
  sequence and one KV head, padded with zero rows. A tile holds BLOCK_Q = BLOCK_M // G
  positions of all G query heads of its KV head (with a GQA group G that does not divide
  BLOCK_M, the BLOCK_M % G rows after them are padding too). Query tiles are aligned to
  absolute positions (tile j holds positions [j*BLOCK_Q, (j+1)*BLOCK_Q)),
  so a row sits at the same place in its tile whether it is decoded alone or
  prefilled inside any chunk: the result then cannot depend on a row's place in
  the matrix unit (the CPU interpreter's BLAS does depend on it). The dot shapes
  along D and along the KV tile never change.
- KV is walked in tiles of BLOCK_N aligned to ABSOLUTE positions, grouped into
  splits by position alone: each of the first BAND_TILES tiles is a split of its
  own, then every CHUNK_TILES tiles make one up to tile WIDE_FROM, and every
  WIDE_TILES tiles beyond it. A split's softmax partial
  (max, sum, unnormalized output) is taken against its own running max, never
  one from an earlier split, so it depends on that split's KV alone. Masked
  scores are -inf and become exact zeros. KV past a sequence's length is read
  as 0, never from the cache, so stale memory (even NaN) cannot leak in through
  0 * NaN. Tiles wholly before a query tile's first position need no mask; they
  skip it and give the same bits (both walks take the exponent by one explicit
  fma, so contraction cannot differ between them).
- Splits are folded in order 0, 1, 2, ... with one formula, `_fold`, written
  with explicit fma so the compiler cannot contract it differently in the two
  kernels that use it. Folding the first split into the empty state is exact,
  so "fold every split in one program" (prefill, large batches) and "store the
  partials of some splits per program, then fold them" (small decode batches)
  give identical bits; the wrapper picks whichever fills the GPU better, and how
  many splits a program takes only shapes the launch.
- Why splits grow with position: one-tile splits let a short context spread over
  many programs (decode at batch 1 is latency-bound), but every split is one more
  step of the serial fold; past BAND_TILES the fold would dominate, so splits
  grow to CHUNK_TILES tiles, walked with the usual online softmax, and at long
  context to WIDE_TILES, where there are enough of them to fill the GPU anyway.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.device import dependent_launch_options, early_launch, let_dependents_launch, sm_count, wait_for_kernel_ahead
from kernels.launch import cdiv, launch, next_power_of_2
from kernels.toolchain import FP_FUSION

# The constants that fix every row's summation order: changing any of them changes output
# bits, so they are part of the kernel version.
BLOCK_N = 64       # KV positions per tile
BAND_TILES = 32    # tiles 0..31 (positions < 2048) are one split each
CHUNK_TILES = 4    # then splits of 4 tiles (256 positions)
WIDE_FROM = 128    # from tile 128 (position 8192) on,
WIDE_TILES = 16    # splits of 16 tiles (1024 positions)
# (max of max_q_len, BLOCK_M query rows per program, num_warps): first row that fits wins.
# BLOCK_M only decides which rows share a program; bench/kernels_attention.py checks on
# the GPU that every row here gives the same bits as the first (on an H100 with Triton
# 3.6, BLOCK_M 64/128 and 4/8 warps all did; 16 and 32 rows did not).
CONFIGS = ((1024, 64, 4), (1 << 62, 128, 8))
# The head sizes measured on the GPU (bench/kernels_attention_gqa.py): any GQA group up to a
# tile's rows, head_dim 64 or 128.
HEAD_DIMS = (64, 128)


def attention_layout_problem(num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    """Why these kernels cannot serve a model with this head layout, or None."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        return f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
    group, rows = num_heads // num_kv_heads, min(m for _, m, _ in CONFIGS)
    if group > rows:
        return (f"{num_heads} query heads per KV head ({num_heads} / {num_kv_heads}) do not fit in the attention "
                f"kernel's {rows}-row tile")
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} is not one the invariant attention kernel runs ({', '.join(map(str, HEAD_DIMS))})"
    return None

# KV tiles in flight per program. Decode walks are chains of dependent page-table and
# KV loads with little math, so they keep a third tile coming: 2-6% faster at batch 2-256
# (bench/kernels_attention_latency.py, input sets rotated past the L2; 5% slower at
# batch 1 / 512 only). Prefill keeps the two it was tuned with. Scheduling only: no sum
# changes order (bits equal in every case of that bench).
NUM_STAGES = 2
DECODE_STAGES = 3

# The split path (decode-like calls only: a prefill's partials would be T*H rows per
# split) runs while the fold-in-program path would have fewer programs than SMs (it fits
# two per SM), unless that path already has half an SM's worth of programs with chains no
# longer than the band: there its single launch wins (batch 16 at context 512 and 2048:
# 4% and 6% faster). Past the band, a split program takes one chunk or CHUNK_TILES
# one-tile splits, twice that once there would be over _SPLIT_PROGRAMS_PER_SM programs
# per SM anyway (fewer, longer programs: 1-3% at batch 2-16, context 8192-32768); within
# it, one-tile splits are shared out for _SPLIT_PROGRAMS_PER_SM programs per SM. H100
# decode sweeps (bench/results/kernels_attention_notes.md): these picks were the best or
# within 5% of it at batch 1-16, context 512-32768. None of them changes bits.
_SPLIT_PROGRAMS_PER_SM = 2
# The partials buffer of the split path is T*H*splits*D fp32; past this size the
# fold-in-program path runs instead (same bits, no buffer), even when the split path was
# asked for: the kernels index the buffer in int32, and a forced split on a long prefill
# (10000 tokens at 32 heads) overran it and faulted.
_MAX_PARTIALS_BYTES = 1 << 30
# Partials fold, (rows, D columns (None: all), most splits loaded together, warps) per
# program. With few (token, head) rows its time is one row's serial chain, so "narrow"
# programs take one row and a slice of D and keep up to 32 splits' loads in flight; with
# many rows that is tens of thousands of one-warp programs, so "wide" ones run there
# (bench/results/kernels_attention_notes.md, 2026-11-22 evening). The CPU interpreter pays
# per program. Unrolling past the number of splits only adds masked steps, so it stops
# at the next power of two. The fold is elementwise per (row, column): none of these
# changes bits.
_FOLD = {"narrow": (1, 32, 32, 1), "wide": (8, None, 8, 4), "cpu": (64, None, 8, 4)}
_FOLD_NARROW_ROWS_PER_SM = 8


@triton.jit
def _seq_of(cu_ptr, idx, S, n_iter):
    """Largest s in [0, S] with cu[s] <= idx (binary search over a prefix sum); idx may be a vector."""
    lo = idx * 0
    hi = lo + S
    for _ in range(n_iter):
        mid = (lo + hi + 1) // 2
        go = tl.load(cu_ptr + mid) <= idx
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    return lo


@triton.jit
def _rows(r, first, q_first, q_len, kv_head, G: tl.constexpr, ROWS: tl.constexpr, PADDED: tl.constexpr):
    """(absolute position, token in the sequence, head, real?) of tile rows r; the tile's first position is `first`.
    PADDED: rows from ROWS on are padding (they would repeat the next tile's first position)."""
    pos = first + r // G
    tok = pos - q_first
    real = (tok >= 0) & (tok < q_len)
    if PADDED:
        real = real & (r < ROWS)
    return pos, tok, kv_head * G + r % G, real


@triton.jit
def _split_of(tile, BAND: tl.constexpr, CHUNK: tl.constexpr, WIDE_FROM: tl.constexpr, WIDE: tl.constexpr):
    """Index of the split holding KV tile `tile` (a vector or a scalar)."""
    return tl.where(tile < BAND, tile,
                    tl.where(tile < WIDE_FROM, BAND + (tile - BAND) // CHUNK,
                             BAND + (WIDE_FROM - BAND) // CHUNK + (tile - WIDE_FROM) // WIDE))


@triton.jit
def _chunk_tiles(c, t_end, BAND: tl.constexpr, CHUNK: tl.constexpr, WIDE_FROM: tl.constexpr, WIDE: tl.constexpr):
    """Tiles [t0, t1) of chunk split c (split BAND + c), cut at t_end."""
    n_mid: tl.constexpr = (WIDE_FROM - BAND) // CHUNK
    t0 = tl.where(c < n_mid, BAND + c * CHUNK, WIDE_FROM + (c - n_mid) * WIDE)
    return t0, tl.minimum(t0 + tl.where(c < n_mid, CHUNK, WIDE), t_end)


@triton.jit
def _fold(M, L, O, m, l, acc):
    """Merge one split's (max, sum, unnormalized output) into the running state, base-2 logits."""
    M_new = tl.maximum(M, m)
    M_ref = tl.where(M_new == float("-inf"), 0.0, M_new)
    a = tl.exp2(M - M_ref)
    b = tl.exp2(m - M_ref)
    L = tl.fma(L, a, l * b)
    O = tl.fma(O, a[:, None], acc * b[:, None])
    return M_new, L, O


@triton.jit
def _take_owned(a, a_own, b, b_own):
    """_pair_rows' combine: of two rows, the owned one."""
    return tl.where(a_own, a, b), a_own | b_own


@triton.jit
def _pair_rows(x, own):
    """[BLOCK_M, W] -> [BLOCK_M // 2, W]: of rows r and r + 8 of each 16-row group, the one where
    `own` holds (either where neither does). A select, exact for every value.

    A decode program's real rows are G <= 8 consecutive ones, so never both
    rows of a pair; and in the wgmma accumulator each thread holds exactly such a pair, so
    this costs a register select and halves the per-row work that follows: a one-tile split's
    softmax and fold, the division and the stores."""
    M: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1]
    x4 = tl.reshape(x, [M // 16, 2, 8, W])
    own4 = tl.broadcast_to(tl.reshape(own, [M // 16, 2, 8, 1]), x4.shape)
    picked, _ = tl.reduce((x4, own4), 1, _take_owned)
    return tl.reshape(picked, [M // 2, W])


@triton.jit
def _unpair_rows(x):
    """[BLOCK_M // 2, W] -> [BLOCK_M, W]: _pair_rows' kept row in both rows of its pair (in the
    wgmma accumulator the same thread's registers)."""
    HALF: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1]
    x4 = tl.broadcast_to(tl.reshape(x, [HALF // 8, 1, 8, W]), [HALF // 8, 2, 8, W])
    return tl.reshape(x4, [2 * HALF, W])


@triton.jit
def _pair_values(v, own):
    """_pair_rows of a per-row vector."""
    return tl.reshape(_pair_rows(v[:, None], own), [v.shape[0] // 2])


@triton.jit
def _paired_ids(first_own, M: tl.constexpr, G: tl.constexpr):
    """Ids of the rows _pair_rows keeps when the G owned rows start at row first_own: in closed
    form, so that offsets built from them keep their alignment (picked through the select,
    they lost it and the stores their vector width)."""
    i = tl.arange(0, M // 2)
    if 8 % G == 0:   # a group aligned to G lies in one half of its 16 rows: one offset for all
        return i // 8 * 16 + first_own // 8 % 2 * 8 + i % 8
    low = i // 8 * 16 + i % 8   # pair i is rows low and low + 8; the owned one, else low + 8
    return tl.where((low >= first_own) & (low < first_own + G), low, low + 8)


@triton.jit
def _kv_tile(k_head, v_head, bt, n0, kv_len, d, d_ok, stride_kb, stride_kp,
             PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Positions, K and V of one tile. MASKED: it may reach past the sequence's end (read as 0)."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_ok = n < kv_len
    page = tl.load(bt + n // PAGE, mask=n_ok, other=0).to(tl.int64)
    offs = page[:, None] * stride_kb + (n % PAGE)[:, None] * stride_kp + d[None, :]  # V's too: same strides
    mask = (n_ok[:, None] & d_ok[None, :]) if MASKED else d_ok[None, :]
    return n, tl.load(k_head + offs, mask=mask, other=0.0), tl.load(v_head + offs, mask=mask, other=0.0)


@triton.jit
def _top(raw, n, pos, scale_log2, MASKED: tl.constexpr):
    """Each row's max base-2 score of raw q.k (positions past a row's own are -inf).

    The max is taken before the scaling: rounding x * scale is monotone in x for a
    scale > 0, so this is the max of the scaled scores, bit for bit (but perhaps the sign
    of a zero, which no later step tells apart), at one multiply per row instead of one
    per score. The multiply is an fma with a zero addend because a plain one would be
    contracted into the subtraction that follows it in one caller and not in another."""
    if MASKED:
        top = tl.max(tl.where(n[None, :] <= pos[:, None], raw, float("-inf")), 1)
    else:
        top = tl.max(raw, 1)
    return tl.fma(top, scale_log2, 0.0)


@triton.jit
def _weights(raw, n, pos, scale_log2, ref, MASKED: tl.constexpr):
    """exp2(score - ref), the exponent by one fma in both walks; masked entries exact zeros."""
    p = tl.exp2(tl.fma(raw, scale_log2, -ref[:, None]))
    if MASKED:
        p = tl.where(n[None, :] <= pos[:, None], p, 0.0)
    return p


@triton.jit
def _online(m, l, acc, q, k_head, v_head, bt, n0, kv_len, pos, d, d_ok, scale_log2,
            stride_kb, stride_kp,
            PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """One tile into a chunk split's running (max, sum, output): the online softmax step."""
    n, k, v = _kv_tile(k_head, v_head, bt, n0, kv_len, d, d_ok, stride_kb, stride_kp,
                       PAGE, BLOCK_N, MASKED)
    raw = tl.dot(q, tl.trans(k))
    m_new = tl.maximum(m, _top(raw, n, pos, scale_log2, MASKED))
    ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - ref)
    p = _weights(raw, n, pos, scale_log2, ref, MASKED)
    return m_new, tl.fma(l, alpha, tl.sum(p, 1)), tl.dot(p.to(v.dtype), v, acc * alpha[:, None])


@triton.jit
def _split(q, k_head, v_head, bt, t0, t1, diag, kv_len, pos, own, d, d_ok, scale_log2,
           stride_kb, stride_kp,
           PAGE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
           PAIRS: tl.constexpr):
    """Partial of the split made of tiles [t0, t1): unmasked tiles before diag, then masked ones.
    PAIRS: of the rows _pair_rows keeps by `own`, paired once the walk is done."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for t in range(t0, tl.minimum(t1, diag)):
        m, l, acc = _online(m, l, acc, q, k_head, v_head, bt, t * BLOCK_N, kv_len, pos, d, d_ok, scale_log2,
                            stride_kb, stride_kp, PAGE, BLOCK_N, False)
    for t in range(tl.maximum(t0, diag), t1):
        m, l, acc = _online(m, l, acc, q, k_head, v_head, bt, t * BLOCK_N, kv_len, pos, d, d_ok, scale_log2,
                            stride_kb, stride_kp, PAGE, BLOCK_N, True)
    if PAIRS:
        m, l, acc = _pair_values(m, own), _pair_values(l, own), _pair_rows(acc, own)
    return m, l, acc


@triton.jit
def _tile_split(q, k_head, v_head, bt, n0, kv_len, pos, own, d, d_ok, scale_log2,
                stride_kb, stride_kp,
                PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PAIRS: tl.constexpr):
    """Partial of a one-tile split, against the tile's own max: no state from any other tile.

    PAIRS: of the rows _pair_rows keeps by `own` (`pos` is theirs): the scores are paired as
    they leave the product, so the softmax and the partial take half the tile's rows. The
    product with V takes all of them, each kept row's weights standing in for its pair's,
    whose results are dropped."""
    n, k, v = _kv_tile(k_head, v_head, bt, n0, kv_len, d, d_ok, stride_kb, stride_kp,
                       PAGE, BLOCK_N, MASKED)
    raw = tl.dot(q, tl.trans(k))
    if PAIRS:
        raw = _pair_rows(raw, own)
    m = _top(raw, n, pos, scale_log2, MASKED)
    p = _weights(raw, n, pos, scale_log2, tl.where(m == float("-inf"), 0.0, m), MASKED)
    if PAIRS:
        return m, tl.sum(p, 1), _pair_rows(tl.dot(_unpair_rows(p).to(v.dtype), v), own)
    return m, tl.sum(p, 1), tl.dot(p.to(v.dtype), v)


@triton.jit
def _store_partial(part_o_ptr, part_ml_ptr, part, part_ok, d, d_ok, m, l, acc, BLOCK_D: tl.constexpr):
    """One split's raw partial: folded into the empty state it is exactly itself. `part`,
    `part_ok`: offsets and mask of the rows stored (with PAIRS, those _pair_rows keeps)."""
    tl.store(part_o_ptr + part + d[None, :], acc, mask=part_ok[:, None] & d_ok[None, :])
    # part_ml is [T, H, splits, 2], indexed like part_o without its last (BLOCK_D) axis.
    tl.store(part_ml_ptr + part // BLOCK_D * 2, m[:, None], mask=part_ok[:, None])
    tl.store(part_ml_ptr + part // BLOCK_D * 2 + 1, l[:, None], mask=part_ok[:, None])


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, part_o_ptr, part_ml_ptr,
    block_tables_ptr, cu_q_ptr, kv_lens_ptr, cu_tiles_ptr,
    S, n_iter, scale_log2, tiles_per_program, chunks_per_program, tile_programs,
    stride_qt, stride_qh,
    stride_kb, stride_kp, stride_kh,
    stride_ot, stride_oh,
    stride_bt,
    stride_pt, stride_ph, stride_ps,
    D: tl.constexpr, BLOCK_D: tl.constexpr, G: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BAND: tl.constexpr, CHUNK: tl.constexpr,
    WIDE_FROM: tl.constexpr, WIDE: tl.constexpr, SPLIT: tl.constexpr, DECODE: tl.constexpr, PDL: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // G
    ROWS: tl.constexpr = BLOCK_Q * G
    PADDED: tl.constexpr = ROWS != BLOCK_M
    PAIRS: tl.constexpr = DECODE and G <= 8  # see _pair_rows
    wait_for_kernel_ahead(PDL)
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)

    # Decode-only batches have one tile per sequence: no tile offsets, one launch fewer.
    if DECODE:
        seq = tile
    else:
        seq = _seq_of(cu_tiles_ptr, tile, S, n_iter)
    live = seq < S
    seq = tl.minimum(seq, S - 1)
    q_start = tl.load(cu_q_ptr + seq)
    # (Scalar conditions are folded into bounds rather than and-ed into masks: the
    # interpreter turns `tensor & scalar` into integers.)
    q_len = tl.where(live, tl.load(cu_q_ptr + seq + 1) - q_start, 0)
    kv_len = tl.load(kv_lens_ptr + seq)
    q_first = kv_len - q_len                         # absolute position of the sequence's first query
    if DECODE:
        tile_in_seq = tile * 0
    else:
        tile_in_seq = tile - tl.load(cu_tiles_ptr + seq)
    first = (q_first // BLOCK_Q + tile_in_seq) * BLOCK_Q

    pos, tok, head, row_ok = _rows(tl.arange(0, BLOCK_M), first, q_first, q_len, kv_head, G, ROWS, PADDED)
    last_pos = tl.where(live, tl.minimum(first + BLOCK_Q, kv_len) - 1, -1)

    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # The program's rows need tiles [0, t_end). Tiles before `diag` end before the query
    # tile's first position: only the last tile, or two when BLOCK_Q > BLOCK_N, is masked.
    # A tile wholly past a row's position is exact zeros for it and changes nothing.
    t_end = tl.where(last_pos >= 0, last_pos // BLOCK_N + 1, 0)
    diag = tl.minimum(first // BLOCK_N, t_end)
    band_end = tl.minimum(t_end, BAND)
    bt = block_tables_ptr + seq * stride_bt
    k_head = k_ptr + kv_head * stride_kh
    v_head = v_ptr + kv_head * stride_kh
    # Rows of the output and the partials: with PAIRS, those _pair_rows keeps (the query's G
    # rows start at row (kv_len - 1 - first) * G).
    out_tok, out_head, out_ok = tok, head, row_ok
    if PAIRS:
        _, out_tok, out_head, out_ok = _rows(_paired_ids((kv_len - 1 - first) * G, BLOCK_M, G),
                                             first, q_first, q_len, kv_head, G, ROWS, PADDED)
    part = (q_start + out_tok)[:, None] * stride_pt + out_head[:, None] * stride_ph
    # A one-tile split works on those rows only (_tile_split): their positions.
    tile_pos = _pair_values(pos, row_ok) if PAIRS else pos

    if SPLIT:
        # Programs [0, tile_programs) take runs of one-tile splits, the rest runs of chunks.
        z = tl.program_id(2)
        if z < tile_programs:
            t_lo = z * tiles_per_program
            t_hi = tl.minimum(t_lo + tiles_per_program, band_end)
            for t in range(t_lo, tl.minimum(t_hi, diag)):
                m, l, acc = _tile_split(q, k_head, v_head, bt, t * BLOCK_N, kv_len, tile_pos, row_ok, d, d_ok,
                                        scale_log2, stride_kb, stride_kp, PAGE, BLOCK_N, False, PAIRS)
                _store_partial(part_o_ptr, part_ml_ptr, part + t * stride_ps, out_ok, d, d_ok, m, l, acc, BLOCK_D)
            for t in range(tl.maximum(t_lo, diag), t_hi):
                m, l, acc = _tile_split(q, k_head, v_head, bt, t * BLOCK_N, kv_len, tile_pos, row_ok, d, d_ok,
                                        scale_log2, stride_kb, stride_kp, PAGE, BLOCK_N, True, PAIRS)
                _store_partial(part_o_ptr, part_ml_ptr, part + t * stride_ps, out_ok, d, d_ok, m, l, acc, BLOCK_D)
        else:
            c_lo = (z - tile_programs) * chunks_per_program
            for c in range(c_lo, c_lo + chunks_per_program):
                t0, t1 = _chunk_tiles(c, t_end, BAND, CHUNK, WIDE_FROM, WIDE)
                if t0 < t_end:
                    m, l, acc = _split(q, k_head, v_head, bt, t0, t1, diag, kv_len, pos, row_ok,
                                       d, d_ok, scale_log2, stride_kb, stride_kp,
                                       PAGE, BLOCK_N, BLOCK_M, BLOCK_D, PAIRS)
                    _store_partial(part_o_ptr, part_ml_ptr, part + (BAND + c) * stride_ps, out_ok, d, d_ok, m, l,
                                   acc, BLOCK_D)
    else:
        FOLD_M: tl.constexpr = BLOCK_M // 2 if PAIRS else BLOCK_M
        M = tl.full([FOLD_M], float("-inf"), tl.float32)
        L = tl.zeros([FOLD_M], tl.float32)
        O = tl.zeros([FOLD_M, BLOCK_D], tl.float32)
        for t in range(0, tl.minimum(band_end, diag)):
            m, l, acc = _tile_split(q, k_head, v_head, bt, t * BLOCK_N, kv_len, tile_pos, row_ok, d, d_ok,
                                    scale_log2, stride_kb, stride_kp, PAGE, BLOCK_N, False, PAIRS)
            M, L, O = _fold(M, L, O, m, l, acc)
        for t in range(diag, band_end):
            m, l, acc = _tile_split(q, k_head, v_head, bt, t * BLOCK_N, kv_len, tile_pos, row_ok, d, d_ok,
                                    scale_log2, stride_kb, stride_kp, PAGE, BLOCK_N, True, PAIRS)
            M, L, O = _fold(M, L, O, m, l, acc)
        for c in range(0, _split_of(t_end - 1, BAND, CHUNK, WIDE_FROM, WIDE) + 1 - BAND):
            t0, t1 = _chunk_tiles(c, t_end, BAND, CHUNK, WIDE_FROM, WIDE)
            m, l, acc = _split(q, k_head, v_head, bt, t0, t1, diag, kv_len, pos, row_ok,
                               d, d_ok, scale_log2, stride_kb, stride_kp,
                               PAGE, BLOCK_N, BLOCK_M, BLOCK_D, PAIRS)
            M, L, O = _fold(M, L, O, m, l, acc)
        o = tl.div_rn(O, tl.where(L > 0, L, 1.0)[:, None])  # L == 0 only on padding rows
        tl.store(o_ptr + (q_start + out_tok)[:, None] * stride_ot + out_head[:, None] * stride_oh + d[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=out_ok[:, None] & d_ok[None, :])


@triton.jit
def _fold_partials_kernel(
    o_ptr, part_o_ptr, part_ml_ptr, cu_q_ptr, kv_lens_ptr,
    S, n_iter, n_rows,
    stride_ot, stride_oh, stride_pt, stride_ph, stride_ps,
    H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, CHUNK_D: tl.constexpr,
    UNROLL: tl.constexpr, DECODE_ONLY: tl.constexpr, BLOCK_N: tl.constexpr, BAND: tl.constexpr,
    CHUNK: tl.constexpr, WIDE_FROM: tl.constexpr, WIDE: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
):
    let_dependents_launch(EARLY)
    wait_for_kernel_ahead(PDL)
    # Rows are (token, head) pairs; each folds its own splits, up to the one holding pos. A row
    # that has run out of splits folds the empty split (-inf, 0, 0): an exact no-op.
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = r // H
    h = r % H
    if DECODE_ONLY:  # token t is sequence t's only query, at its last position: no search
        pos = tl.load(kv_lens_ptr + tl.minimum(t, S - 1)) - 1
    else:
        seq = tl.minimum(_seq_of(cu_q_ptr, t, S, n_iter), S - 1)
        q_start = tl.load(cu_q_ptr + seq)
        q_len = tl.load(cu_q_ptr + seq + 1) - q_start
        pos = tl.load(kv_lens_ptr + seq) - q_len + (t - q_start)
    n_splits = tl.where(r < n_rows, _split_of(pos // BLOCK_N, BAND, CHUNK, WIDE_FROM, WIDE) + 1, 0)

    d = tl.program_id(1) * CHUNK_D + tl.arange(0, CHUNK_D)
    d_ok = d < D
    M = tl.full([BLOCK_R], float("-inf"), tl.float32)
    L = tl.zeros([BLOCK_R], tl.float32)
    O = tl.zeros([BLOCK_R, CHUNK_D], tl.float32)
    # The fold is a serial chain; unrolling lets the loads of UNROLL splits be in flight at once.
    for group in range(0, tl.cdiv(tl.max(n_splits, 0), UNROLL)):
        for i in tl.static_range(UNROLL):
            sp = group * UNROLL + i
            take = sp < n_splits
            part = t * stride_pt + h * stride_ph + sp * stride_ps
            acc = tl.load(part_o_ptr + part[:, None] + d[None, :], mask=take[:, None] & d_ok[None, :], other=0.0)
            m = tl.load(part_ml_ptr + part // BLOCK_D * 2, mask=take, other=float("-inf"))
            l = tl.load(part_ml_ptr + part // BLOCK_D * 2 + 1, mask=take, other=0.0)
            M, L, O = _fold(M, L, O, m, l, acc)
    o = tl.div_rn(O, tl.where(L > 0, L, 1.0)[:, None])  # L == 0 only on rows never stored
    tl.store(o_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=(n_splits > 0)[:, None] & d_ok[None, :])


@triton.jit
def _tile_offsets_kernel(cu_q_ptr, kv_lens_ptr, cu_tiles_ptr, S, BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr):
    """cu_tiles[s+1] = number of position-aligned query tiles of sequences 0..s (one launch, no sync)."""
    s = tl.arange(0, BLOCK_S)
    ok = s < S
    q_len = tl.load(cu_q_ptr + s + 1, mask=ok, other=0) - tl.load(cu_q_ptr + s, mask=ok, other=0)
    kv_len = tl.load(kv_lens_ptr + s, mask=ok, other=1)
    tiles = tl.where(q_len > 0, (kv_len - 1) // BLOCK_Q - (kv_len - q_len) // BLOCK_Q + 1, 0)
    tl.store(cu_tiles_ptr + s + 1, tl.cumsum(tiles, 0), mask=ok)
    tl.store(cu_tiles_ptr + s, 0, mask=s == 0)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcp, stride_kch, stride_vcb, stride_vcp, stride_vch,
    H_KV: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    block = slot // PAGE
    offset = slot % PAGE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    # A skipped slot (-1) masks every head: bound folded in, as `tensor & scalar` breaks the interpreter.
    mask = (h < tl.where(slot >= 0, H_KV, 0))[:, None] & (d < D)[None, :]
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(k_cache_ptr + block * stride_kcb + offset * stride_kcp + h[:, None] * stride_kch + d[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + block * stride_vcb + offset * stride_vcp + h[:, None] * stride_vch + d[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(k, v, k_cache, v_cache, slot_mapping) -> None:
    T, h_kv, D = k.shape
    assert k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    if T == 0:
        return
    launch(_store_kv_kernel, (T,),
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        H_KV=h_kv, BLOCK_H=next_power_of_2(h_kv), D=D, BLOCK_D=next_power_of_2(D),
        PAGE=k_cache.shape[1], enable_fp_fusion=FP_FUSION,
    )


def _n_iter(n: int) -> int:
    return max(1, math.ceil(math.log2(n + 1)))


def paged_attention_triton(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, *,
    max_q_len: int, max_kv_len: int, split_per_program: bool | None = None,
    splits_per_program: tuple[int, int] | None = None, config: tuple[int, int] | None = None, early: bool = False,
) -> torch.Tensor:
    """split_per_program: None lets the wrapper choose; True takes the split path wherever its
    partials fit in _MAX_PARTIALS_BYTES. Both paths give identical bits, and so does every
    splits_per_program, (one-tile splits, chunk splits) per split-path program
    (None: chosen to fill the GPU). config: (BLOCK_M, num_warps), default from CONFIGS by
    max_q_len."""
    block_m, num_warps = config or next((m, w) for limit, m, w in CONFIGS if max_q_len <= limit)
    T, H, D = q.shape
    S = kv_lens.shape[0]
    h_kv = k_cache.shape[2]
    G = H // h_kv
    assert H % h_kv == 0 and G <= block_m, f"GQA group {G} must fit in a {block_m}-row tile"
    assert q.stride(2) == 1 and k_cache.stride(3) == 1
    # One address per KV element serves K and V; the row max is taken before the scaling (_top).
    assert k_cache.stride() == v_cache.stride(), "K and V caches must share their layout"
    assert scale > 0, "the softmax scale must be positive"
    o = torch.empty_like(q)
    if T == 0:
        return o
    block_q = block_m // G
    decode_only = max_q_len == 1
    if decode_only:
        n_tiles, cu_tiles = S, cu_seqlens_q  # cu_tiles unread
    else:
        cu_tiles = torch.empty(S + 1, dtype=torch.int32, device=q.device)
        launch(_tile_offsets_kernel, (1,), cu_seqlens_q, kv_lens, cu_tiles, S,
               BLOCK_Q=block_q, BLOCK_S=next_power_of_2(S + 1), enable_fp_fusion=FP_FUSION)
        # Upper bound on the number of position-aligned query tiles, known on the host: no device sync.
        n_tiles = min(S * (cdiv(max_q_len, block_q) + 1), T // block_q + 2 * S)
    assert (WIDE_FROM - BAND_TILES) % CHUNK_TILES == 0, "chunks must end where the wide splits begin"
    kv_tiles = cdiv(max(max_kv_len, 1), BLOCK_N)
    band_tiles = min(kv_tiles, BAND_TILES)
    mid_tiles = min(kv_tiles, WIDE_FROM) - band_tiles
    chunks = cdiv(mid_tiles, CHUNK_TILES) + cdiv(kv_tiles - band_tiles - mid_tiles, WIDE_TILES)
    n_splits = band_tiles + chunks
    BLOCK_D = next_power_of_2(D)
    sms = sm_count(q.device) if q.is_cuda else 1
    partials_fit = T * H * n_splits * BLOCK_D * 4 <= _MAX_PARTIALS_BYTES
    if split_per_program is None:
        fold_programs = n_tiles * h_kv
        split_per_program = (n_splits > 1 and max_q_len <= block_q
                             and (2 * fold_programs < sms or (fold_programs < sms and kv_tiles > BAND_TILES)))
    split_per_program = split_per_program and partials_fit
    if split_per_program:
        if splits_per_program:
            per_tile, per_chunk = splits_per_program
        elif chunks:
            programs = n_tiles * h_kv * (cdiv(band_tiles, CHUNK_TILES) + chunks)
            per_tile, per_chunk = CHUNK_TILES * (2 if programs > _SPLIT_PROGRAMS_PER_SM * sms else 1), 1
        else:
            per_tile, per_chunk = cdiv(n_tiles * h_kv * band_tiles, _SPLIT_PROGRAMS_PER_SM * sms), 1
        tile_programs = cdiv(band_tiles, per_tile)
        grid_splits = tile_programs + cdiv(chunks, per_chunk)
        part_o = torch.empty(T, H, n_splits, BLOCK_D, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(T, H, n_splits, 2, dtype=torch.float32, device=q.device)
    else:
        per_tile, per_chunk, tile_programs, grid_splits = 0, 0, 0, 1
        part_o = part_ml = o  # unused by the fold-in-program path
    pdl = dependent_launch_options(q.device)
    launch(_attention_kernel, (n_tiles, h_kv, grid_splits),
        q, k_cache, v_cache, o, part_o, part_ml,
        block_tables, cu_seqlens_q, kv_lens, cu_tiles,
        S, _n_iter(S), scale * math.log2(math.e), per_tile, per_chunk, tile_programs,
        q.stride(0), q.stride(1),
        *k_cache.stride()[:3],
        o.stride(0), o.stride(1),
        block_tables.stride(0),
        *(part_o.stride()[:3] if split_per_program else (0, 0, 0)),
        D=D, BLOCK_D=BLOCK_D, G=G, PAGE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        BAND=BAND_TILES, CHUNK=CHUNK_TILES, WIDE_FROM=WIDE_FROM, WIDE=WIDE_TILES, SPLIT=bool(split_per_program),
        DECODE=decode_only, **pdl, num_warps=num_warps,
        num_stages=DECODE_STAGES if max_q_len <= block_q else NUM_STAGES, enable_fp_fusion=FP_FUSION,
    )
    if split_per_program:
        if not q.is_cuda:
            fold = "cpu"
        else:
            fold = "narrow" if T * H <= _FOLD_NARROW_ROWS_PER_SM * sms else "wide"
        rows, chunk_d, max_unroll, warps = _FOLD[fold]
        chunk_d = chunk_d or BLOCK_D
        launch(_fold_partials_kernel, (cdiv(T * H, rows), cdiv(BLOCK_D, chunk_d)),
            o, part_o, part_ml, cu_seqlens_q, kv_lens,
            S, _n_iter(S), T * H,
            o.stride(0), o.stride(1), *part_o.stride()[:3],
            H=H, D=D, BLOCK_D=BLOCK_D, BLOCK_R=rows, CHUNK_D=chunk_d,
            UNROLL=min(max_unroll, next_power_of_2(n_splits)), DECODE_ONLY=decode_only, BLOCK_N=BLOCK_N,
            BAND=BAND_TILES, CHUNK=CHUNK_TILES, WIDE_FROM=WIDE_FROM, WIDE=WIDE_TILES, **pdl,
            EARLY=early_launch(early, q), num_warps=warps, enable_fp_fusion=FP_FUSION,
        )
    return o
