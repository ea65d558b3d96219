import random

import pytest
import torch

import kernels
from kernels.mode import mode
from kernels.norm import rms_norm, rms_norm_reference, rms_norm_residual

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
