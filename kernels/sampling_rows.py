"""Per-row building blocks shared by the sampling kernels (kernels/sampling_triton.py,
kernels/sampling_filter.py): a row's parameters, its scaled scores and their
order-preserving int32 keys, the (max, mass) chunk partials with their merge, and
the counters by which one program waits for others of the same launch.

The partials are the only place a row's floating-point sums are taken: one per
chunk of a fixed size, merged by one fixed tree over the chunks, so every kernel
that uses them sums in an order set by V and the chunk size alone.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_mass(s):
    """(max, sum of exp(s - max)) of one chunk: one exp per token, the rescale left to the merge."""
    top = tl.max(s, axis=0)
    # A chunk of only -inf keeps mass 0 instead of exp(-inf - -inf) = nan.
    ref = tl.where(top == float("-inf"), 0.0, top)
    return top, tl.sum(tl.exp(s - ref), axis=0)


@triton.jit
def load_partials(m_ptr, z_ptr, C, CP: tl.constexpr):
    i = tl.arange(0, CP)
    return tl.load(m_ptr + i, mask=i < C, other=float("-inf")), tl.load(z_ptr + i, mask=i < C, other=0.0)


@triton.jit
def merged_mass(m, z):
    """Row max, each chunk's mass rescaled to it, and their sum, from a row's chunk partials."""
    top = tl.max(m, axis=0)
    ref = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(m == float("-inf"), 0.0, z * tl.exp(m - ref))
    return ref, w, tl.sum(w, axis=0)


@triton.jit
def order_key(s):
    # fp32 -> int32 whose signed order is the float order: flip the magnitude bits of negatives.
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def from_order_key(key):
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def row_params(temp_ptr, top_k_ptr, top_p_ptr, row, V):
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
def scaled_chunk(base, ids, V, inverse):
    valid = ids < V
    x = tl.load(base + ids, mask=valid, other=float("-inf")).to(tl.float32)
    s = x * inverse
    return tl.where(s == 0.0, 0.0, s), valid


@triton.jit
def crossing(running, mass, ids, target, V):
    """The drawn id: the first whose running mass passes target; if rounding leaves the target
    unreached, the last id with mass; 0 when none has any (every kept score -inf)."""
    token = tl.min(tl.where((running > target) & (mass > 0.0), ids, V), axis=0)
    return tl.where(token == V, tl.maximum(tl.max(tl.where(mass > 0.0, ids, -1), axis=0), 0), token)


@triton.jit
def kept(s, ids, valid, threshold, cut):
    """The kept set: keys above the boundary, and boundary ties up to the cut id."""
    key = order_key(s)
    return valid & ((key > threshold) | ((key == threshold) & (ids <= cut)))


@triton.jit
def release(counter_ptr):
    """Count this program in, once every thread's stores before it are visible GPU-wide."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def wait_for(counter_ptr, n):
    """Spin until n programs have released the counter (acquire: their stores are then seen).
    Only for programs of lower ids, which never wait on this one: with blocks dispatched in
    id order (and the interpreter's one-by-one order) the wait always ends."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < n:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
