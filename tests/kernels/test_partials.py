"""A decode matmul's K-segment sums, added by the kernel that reads its product (kernels.partials),
give that kernel the product's bits: the residual RMSNorm and the RoPE + KV write compute what
they compute from the product the matmul's own last program adds. Under the interpreter fp16 (its
bf16 casts truncate)."""
import pytest
import torch

import kernels
from kernels.matmul import CONFIGS, _matmul_triton, k_segments
from kernels.norm import rms_norm_residual
from kernels.partials import Partials
from kernels.rotary import rope_store_kv
from test_rotary import tables

GPU = torch.cuda.is_available()
DTYPE = torch.bfloat16 if GPU else torch.float16
SPLIT = (*CONFIGS["decode"][:4], "split")
# (K, N) of a product the norm reads (N = hidden), and RoPE's (heads, KV heads, head dim) with K.
# The GPU's shapes take both ways of loading them: 2-warp norms pipeline, 8-warp ones unroll.
NORM_SHAPES = ((2048, 1024), (3072, 1024), (512, 4096)) if GPU else ((160, 64), (96, 2048))
ROPE_SHAPES = (((16, 8, 128), 1024), ((32, 8, 128), 4096)) if GPU else (((4, 2, 16), 160),)
ROWS = (1, 5, 16, 100)   # 100: a batch, on the 64-row split tile (kernels.matmul._batch_split)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)   # tells +0 from -0, which torch.equal does not


def split_pair(a: torch.Tensor, weight: torch.Tensor) -> tuple[Partials, torch.Tensor]:
    """(the split launch's segment sums, its product as its last programs add it), on the decode
    tile or, past 16 rows, a batch's."""
    config = SPLIT if a.shape[0] <= CONFIGS["decode"][0] else CONFIGS["split64"]
    p = _matmul_triton(a, weight.t(), None, config, unsummed=True)
    assert isinstance(p, Partials) and p.sums.shape[0] == k_segments(a.shape[1], weight.shape[0], DTYPE)[0] > 1
    return p, _matmul_triton(a, weight.t(), None, config)


@pytest.mark.parametrize("K,N", NORM_SHAPES)
def test_torch_adds_them_as_the_matmul_does(K, N, randn, small_segments):
    weight = randn(N, K, dtype=DTYPE)
    for m in ROWS:
        p, product = split_pair(randn(m, K, dtype=DTYPE), weight)
        assert torch.equal(bits(p.product()), bits(product))


@pytest.mark.parametrize("K,N", NORM_SHAPES)
def test_residual_norm_adds_them_as_the_matmul_does(K, N, randn, small_segments):
    weight, norm = randn(N, K, dtype=DTYPE), randn(N, dtype=DTYPE)
    for m in ROWS:
        (p, product), residual = split_pair(randn(m, K, dtype=DTYPE), weight), randn(m, N, dtype=DTYPE)
        got, want = rms_norm_residual(p, residual, norm, 1e-6), rms_norm_residual(product, residual, norm, 1e-6)
        assert all(torch.equal(bits(g), bits(w)) for g, w in zip(got, want))


# Both ways a norm loads the sums: pipelined (at most 2 warps) and unrolled (8 warps).
@pytest.mark.parametrize("H", (64, 4096))
def test_sums_start_from_zero(H, device):
    # Segments of -0 add to +0 from zero (the matmul's order), and +0 + -0 keeps +0 in the residual
    # stream, where the first segment alone would carry -0 through.
    p = Partials(torch.full((3, 2, H), -0.0, device=device), DTYPE)
    residual = torch.full((2, H), -0.0, dtype=DTYPE, device=device)
    _, stream = rms_norm_residual(p, residual, torch.ones(H, dtype=DTYPE, device=device), 1e-6)
    zeros = torch.zeros(2, H, dtype=torch.int16, device=device)
    assert torch.equal(bits(stream), zeros) and torch.equal(bits(p.product()), zeros)


@pytest.mark.parametrize("H", (64, 4096))
def test_sums_add_first_to_last(H, device):
    # 1, e, e, -1 with e = 2^-24: in order 1 + e rounds back to 1 each time and the total is 0;
    # reversed, or in most other orders, 2^-23.
    e = 2.0 ** -24
    p = Partials(torch.tensor([1.0, e, e, -1.0], device=device)[:, None, None].expand(4, 2, H).contiguous(), DTYPE)
    zeros = torch.zeros(2, H, dtype=DTYPE, device=device)
    _, stream = rms_norm_residual(p, zeros, torch.ones(H, dtype=DTYPE, device=device), 1e-6)
    assert torch.equal(bits(stream), bits(zeros)) and torch.equal(bits(p.product()), bits(zeros))
    q_heads, kv_heads, d = ROPE_SHAPES[0][0]
    n = (q_heads + 2 * kv_heads) * d
    qkv = Partials(torch.tensor([1.0, e, e, -1.0], device=device)[:, None, None].expand(4, 2, n).contiguous(), DTYPE)
    cos, sin = tables(8, d, device)
    caches = [[torch.ones(1, 16, kv_heads, d, dtype=DTYPE, device=device) for _ in range(2)] for _ in range(2)]
    positions, slots = torch.tensor([3, 5], device=device), torch.tensor([0, 1], device=device)
    q = [rope_store_kv(x, positions, cos, sin, *cache, slots, q_heads, kv_heads)
         for x, cache in zip((qkv, torch.zeros(2, n, dtype=DTYPE, device=device)), caches)]
    assert torch.equal(bits(q[0]), bits(q[1]))
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(*caches))


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("heads,K", ROPE_SHAPES)
def test_rope_adds_them_as_the_matmul_does(heads, K, norm, randn, gen, device, small_segments):
    q_heads, kv_heads, d = heads
    page, blocks = 16, 8
    weight = randn((q_heads + 2 * kv_heads) * d, K, dtype=DTYPE)
    cos, sin = tables(4096, d, device)
    weights = (randn(d, dtype=DTYPE), randn(d, dtype=DTYPE)) if norm else (None, None)
    for m in ROWS:
        p, product = split_pair(randn(m, K, dtype=DTYPE), weight)
        positions = torch.randint(0, 4000, (m,), generator=gen).to(device)
        slots = torch.randperm(blocks * page, generator=gen)[:m].to(device)
        slots[1::3] = -1   # padding rows write nothing
        start = [randn(blocks, page, kv_heads, d, dtype=DTYPE) for _ in range(2)]
        caches = [[c.clone() for c in start] for _ in range(2)]
        q = [rope_store_kv(x, positions, cos, sin, *cache, slots, q_heads, kv_heads, *weights, 1e-6)
             for x, cache in zip((p, product), caches)]
        assert torch.equal(bits(q[0]), bits(q[1]))
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(*caches))


def test_a_split_with_a_bias_or_gated_is_summed(randn, small_segments):
    # The bias and swiglu's SiLU·up need the sums: the split launch adds them itself.
    K, N = NORM_SHAPES[0]
    weight, bias, a = randn(N, K, dtype=DTYPE), randn(N, dtype=DTYPE), randn(1, K, dtype=DTYPE)
    for b, gated in ((bias, False), (None, True)):
        out = _matmul_triton(a, weight.t(), b, SPLIT, gated=gated, unsummed=True)
        assert isinstance(out, torch.Tensor) and torch.equal(out, _matmul_triton(a, weight.t(), b, SPLIT, gated=gated))


def test_partials_only_where_a_launch_splits(randn, device):
    # A large batch, a bias, or one segment (the LM head): the product itself, as matmul gives it.
    # Under the interpreter nothing splits (one config for every shape), so the rule is the GPU's.
    K, N = NORM_SHAPES[0]
    weight, bias = randn(N, K, dtype=DTYPE), randn(N, dtype=DTYPE)
    for a, b in ((randn(300, K, dtype=DTYPE), None), (randn(1, K, dtype=DTYPE), bias)):
        out = kernels.matmul_partials(a, weight.t(), b)
        assert isinstance(out, torch.Tensor) and torch.equal(out, kernels.matmul(a, weight.t(), b))
    if GPU:
        for m in (1, 32):   # decode, and a batch the split kernel serves
            assert isinstance(kernels.matmul_partials(randn(m, K, dtype=DTYPE), weight.t()), Partials)
        head = randn(151936, 1024, dtype=DTYPE)
        assert isinstance(kernels.matmul_partials(randn(1, 1024, dtype=DTYPE), head.t()), torch.Tensor)
