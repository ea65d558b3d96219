import importlib
import random

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels.mode import mode
from kernels.norm import _sum_of_squares, rms_norm, rms_norm_reference, rms_norm_residual
from kernels.partials import Partials

if torch.cuda.is_available():
    DTYPES = (torch.bfloat16, torch.float16, torch.float32)
    HIDDEN = (4096, 5120, 8192)
    BATCH_SIZES = (1, 2, 3, 17, 64, 255, 1024, 4096, 16384)
    TRIALS = 24
else:
    # The interpreter casts fp32 to bf16 by truncation (the GPU rounds to
    # nearest even), so bf16 bits are only checked on a GPU.
    DTYPES = (torch.float16, torch.float32)
    HIDDEN = (64, 100)
    BATCH_SIZES = (1, 2, 3, 17, 64)
    TRIALS = 6

# Max relative error per element against fp64: one rounding to the dtype.
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}
EPS = 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", HIDDEN)
def test_row_bits_do_not_depend_on_the_batch(H, dtype, randn, gen):
    # The property: row i alone == row i at a random position among random rows.
    rng = random.Random(gen.initial_seed())
    weight, row = randn(H, dtype=dtype), randn(1, H, dtype=dtype)
    alone = kernels.rms_norm(row, weight, EPS)
    for _ in range(TRIALS):
        m = rng.choice(BATCH_SIZES)
        pos = rng.randrange(m)
        batch = randn(m, H, dtype=dtype) * rng.choice((0.01, 1.0, 100.0))
        batch[pos] = row[0]
        assert torch.equal(kernels.rms_norm(batch, weight, EPS)[pos], alone[0]), (m, pos)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", HIDDEN)
def test_matches_fp64_reference(H, dtype, randn):
    x, weight = randn(33, H, dtype=dtype) * 3, randn(H, dtype=dtype)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()
    err = (rms_norm(x, weight, EPS).double() - ref).abs() / ref.abs().clamp_min(1e-3)
    assert err.max().item() < REL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_residual_equals_add_then_norm(dtype, randn):
    H = HIDDEN[1]
    x, residual, weight = randn(19, H, dtype=dtype), randn(19, H, dtype=dtype), randn(H, dtype=dtype)
    normed, summed = rms_norm_residual(x, residual, weight, EPS)
    assert torch.equal(summed, residual + x)
    assert torch.equal(normed, rms_norm(residual + x, weight, EPS))


def test_strided_rows(randn):
    H = HIDDEN[0]
    wide, weight = randn(7, 2 * H, dtype=torch.float16), randn(H, dtype=torch.float16)
    x = wide[:, :H]
    assert torch.equal(rms_norm(x, weight, EPS), rms_norm(x.contiguous(), weight, EPS))


def test_standard_mode_is_close_to_invariant(randn):
    x, weight = randn(8, HIDDEN[0], dtype=torch.float32), randn(HIDDEN[0], dtype=torch.float32)
    with mode("standard"):
        standard = rms_norm(x, weight, EPS)
    torch.testing.assert_close(standard, rms_norm_reference(x, weight, EPS), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape,w_shape,dtype", [
    ((4, 8, 2), (8,), torch.float32),
    ((4, 8), (9,), torch.float32),
    ((4, 8), (8,), torch.int64),
])
def test_bad_input_is_a_value_error(x_shape, w_shape, dtype):
    with pytest.raises(ValueError):
        rms_norm(torch.ones(x_shape, dtype=dtype), torch.ones(w_shape), EPS)


def test_empty_batch(randn):
    assert rms_norm(randn(0, HIDDEN[0]), randn(HIDDEN[0]), EPS).shape == (0, HIDDEN[0])


def two_warp_sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """The sum of squares of [M, 1024] rows as a 2-warp program's tl.sum adds them (kernels.norm.
    _sum_of_squares), in fp32; its leaves' fma rounds as an add where the squares are exact."""
    s = x.float().view(-1, 2, 64, 8).transpose(1, 2).reshape(-1, 64, 16)   # [row, thread, 16 squares]
    s = s * s
    while s.shape[-1] > 1:   # neighbours in pairs
        s = s[..., 0::2] + s[..., 1::2]
    s = s.view(-1, 2, 32)    # [row, warp, lane]
    while s.shape[-1] > 1:   # lane l with l ^ half
        half = s.shape[-1] // 2
        s = s[..., :half] + s[..., half:]
    return s[:, 0, 0] + s[:, 1, 0]


@triton.jit
def _sum_of_squares_kernel(x_ptr, out_ptr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * 1024 + tl.arange(0, 1024))
    tl.store(out_ptr + row, _sum_of_squares(x, 1024, 2))


def test_written_out_sum_adds_as_two_warps_do(randn, gen):
    # The norm of Partials at hidden 1,024 runs wider than 2 warps with the 2-warp sum written out:
    # that sum against the tree in torch, bit for bit, on fp16 values (exact squares) of scales from
    # 1e-2 to 1e2, which most other orders round otherwise.
    x = (randn(64, 1024) * 10.0 ** (torch.rand(64, 1024, generator=gen) * 4 - 2).to(randn(1).device)).half().float()
    got = torch.empty(64, device=x.device)
    _sum_of_squares_kernel[(64,)](x, got)
    assert torch.equal(got, two_warp_sum_of_squares(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the 2-warp tl.sum's tree is sm_90's")
def test_wide_norm_of_partials_gives_the_two_warp_bits(randn, gen):
    # Rows from 1e-22 (squares fp32 subnormals, where the fma's rounding shows) to 1e15, and rows
    # mixing those scales: the 8-warp norm of Partials against the 2-warp norm of their product.
    rows = 4096
    scale = 10.0 ** (torch.rand(rows, 1, generator=gen) * 37 - 22)
    mixed = 10.0 ** (torch.rand(rows, 1024, generator=gen) * 8 - 4)
    sums = randn(4, rows, 1024) * torch.where(torch.arange(rows)[:, None] % 2 == 0, scale, mixed).cuda()
    for dtype in (torch.bfloat16, torch.float16):
        p = Partials(sums if dtype == torch.bfloat16 else sums.clamp(-6e4, 6e4) / 4, dtype)
        residual, weight = randn(rows, 1024, dtype=dtype), randn(1024, dtype=dtype)
        assert importlib.import_module("kernels.norm")._launch_shape(1024, dtype, 4, sums.device)[:2] == (8, 2)
        got = rms_norm_residual(p, residual, weight, EPS)
        want = rms_norm_residual(p.product(), residual, weight, EPS)
        assert all(torch.equal(g.view(torch.int16), w.view(torch.int16)) for g, w in zip(got, want))
