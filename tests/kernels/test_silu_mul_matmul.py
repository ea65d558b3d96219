"""silu_mul_matmul(x, b) is matmul(silu_mul(x), b), bit for bit, whether the decode tiles apply
silu(gate) * up as they load A (one row) or the activation is written first; and a row's bits
do not depend on the batch. Under the interpreter (fp16, tiny sizes) the decode tiles are forced."""
import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.matmul import CONFIGS, _matmul_triton, k_segments

from tests.kernels.test_activation import every_finite
from tests.kernels.test_matmul import BATCH_SIZES

if torch.cuda.is_available():
    DTYPES = (torch.bfloat16, torch.float16)
    SHAPES = ((3072, 1024), (14336, 4096))   # (K, N): the 0.6B and 8B shapes' down projections
else:
    DTYPES = (torch.float16,)
    SHAPES = ((128, 48), (160, 72))   # K a multiple of BLOCK_K, and one with a tail


def gates(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """n gate values whose silu rounds to one `dtype` value under any expf a few fp32 ulps
    off: the interpreter's (numpy's) and torch's need not agree to the last fp32 bit."""
    g = (torch.randn(4 * n, generator=gen) * 3).to(dtype).double()
    s = g / (1 + torch.exp(-g))
    alike = (s * (1 - 2 ** -20)).to(dtype) == (s * (1 + 2 ** -20)).to(dtype)
    assert alike.sum() >= n
    return g[alike][:n].to(dtype)


def gate_up(m: int, k: int, dtype, gen, device) -> torch.Tensor:
    gate = gates(m * k, dtype, gen).view(m, k)
    up = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    return torch.cat([gate, up], dim=1).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K,N", SHAPES)
def test_fused_decode_tiles_give_the_unfused_bits(K, N, dtype, randn, gen, device, small_segments):
    weight = randn(N, K, dtype=dtype)
    assert k_segments(K, N, dtype)[0] > 1
    for kernel in ("split", "pointer"):   # a program per K segment, and one for them all
        config = (*CONFIGS["decode"][:4], kernel)
        for m in (1, 3, 16):
            x = gate_up(m, K, dtype, gen, device)
            want = _matmul_triton(F.silu(x[:, :K]) * x[:, K:], weight.t(), None, config)
            assert torch.equal(_matmul_triton(x, weight.t(), None, config, silu=True), want), (kernel, m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K,N", SHAPES)
def test_row_bits_do_not_depend_on_the_batch(K, N, dtype, randn, gen, device):
    # Up to 16 rows run the fused decode tiles on a GPU, more the unfused larger tiles.
    weight = randn(N, K, dtype=dtype)
    row = gate_up(1, K, dtype, gen, device)
    alone = kernels.silu_mul_matmul(row, weight.t())
    assert torch.equal(alone, kernels.matmul(kernels.silu_mul(row), weight.t()))
    for m in BATCH_SIZES[:12]:
        batch = gate_up(m, K, dtype, gen, device)
        batch[m // 2] = row[0]
        assert torch.equal(kernels.silu_mul_matmul(batch, weight.t())[m // 2], alone[0]), m


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_gate_value_through_the_fused_tiles(dtype, randn, gen, gpu):
    k, n = SHAPES[0]
    gate = every_finite(dtype).cuda()
    rows = gate.shape[0] // k
    gate = gate[:rows * k].view(rows, k)
    x = torch.cat([gate, (randn(rows, k) * 0.5).to(dtype)], dim=1)
    weight = randn(n, k, dtype=dtype) * 0.05
    for first in range(0, rows, 16):
        chunk = x[first:first + 16]
        want = kernels.matmul(kernels.silu_mul(chunk), weight.t())
        assert torch.equal(kernels.silu_mul_matmul(chunk, weight.t()), want), first


def test_standard_mode_is_silu_then_the_vendor_matmul(randn, gen, device):
    k, n = SHAPES[0]
    x, weight = gate_up(4, k, DTYPES[0], gen, device), randn(n, k, dtype=DTYPES[0])
    with kernels.mode("standard"):
        assert torch.equal(kernels.silu_mul_matmul(x, weight.t()), torch.mm(kernels.silu_mul(x), weight.t()))


@pytest.mark.parametrize("x_shape,b_shape", [((4, 7), (3, 5)), ((4, 8), (5, 5)), ((8,), (4, 5))])
def test_bad_shapes_are_value_errors(x_shape, b_shape):
    with pytest.raises(ValueError):
        kernels.silu_mul_matmul(torch.zeros(x_shape), torch.zeros(b_shape))
