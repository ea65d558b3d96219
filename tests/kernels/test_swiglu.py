"""swiglu(a, [gate | up]) is silu_mul(matmul(a, [gate | up])) bit for bit: where the split kernel
runs on the GPU (decode, small batches) the matmul's epilogue computes it, elsewhere the two
launches do, and a row's bits do not depend on which. Under the interpreter (fp16: its bf16 dot is
wrong) the epilogue's exp is numpy's, so the reference takes numpy's too; on a GPU both are CUDA's
expf."""
import importlib

import numpy as np
import pytest
import torch

import kernels
from kernels.matmul import CONFIGS, _matmul_triton, _swiglu_config, k_segments

matmul_module = importlib.import_module("kernels.matmul")   # not the function `kernels` exports

GPU = torch.cuda.is_available()
DTYPE = torch.bfloat16 if GPU else torch.float16
# (K, 2I): the 0.6B and 8B shapes' gate_up on a GPU; under the interpreter, two tiles of 32 pairs.
SHAPES = ((1024, 6144), (4096, 28672)) if GPU else ((160, 128),)


def silu_mul_of(h: torch.Tensor) -> torch.Tensor:
    if GPU:
        return kernels.silu_mul(h)
    gate, up = h.float().chunk(2, dim=-1)
    silu = (gate / (1 + torch.from_numpy(np.exp(-gate.numpy())))).to(h.dtype)
    return (silu.float() * up.float()).to(h.dtype)


@pytest.mark.parametrize("kernel", ("pointer", "split"))
@pytest.mark.parametrize("K,N", SHAPES)
def test_epilogue_gives_silu_mul_of_the_matmul(kernel, K, N, randn, small_segments):
    if kernel == "split":
        assert k_segments(K, N, DTYPE)[0] > 1
    config = (*CONFIGS["decode"][:4], kernel)
    weight = randn(N, K, dtype=DTYPE)
    for m in (1, 5, 16):
        a = randn(m, K, dtype=DTYPE)
        want = silu_mul_of(_matmul_triton(a, weight.t(), None, config))
        assert torch.equal(_matmul_triton(a, weight.t(), None, config, gated=True), want)


def test_epilogue_at_edge_sizes(randn):
    # No rows, and K = 0, whose product is silu(0) * 0 = 0: what swiglu's decode path may be given.
    config = CONFIGS["decode"]
    assert _matmul_triton(randn(0, 40, dtype=DTYPE), randn(128, 40, dtype=DTYPE).t(), None, config,
                          gated=True).shape == (0, 64)
    out = _matmul_triton(randn(3, 0, dtype=DTYPE), randn(128, 0, dtype=DTYPE).t(), None, config, gated=True)
    assert out.shape == (3, 64) and not out.any()
    # Through the dispatch, at decode and batch sizes: an empty K or N.
    for m in (3, 32):
        out = kernels.swiglu(randn(m, 0, dtype=DTYPE), randn(128, 0, dtype=DTYPE).t())
        assert out.shape == (m, 64) and not out.any()
        assert kernels.swiglu(randn(m, 40, dtype=DTYPE), randn(0, 40, dtype=DTYPE).t()).shape == (m, 0)


@pytest.mark.parametrize("K,N", SHAPES)
def test_row_bits_do_not_depend_on_the_batch(K, N, randn, gpu, monkeypatch):
    monkeypatch.setattr(matmul_module, "sm_count", lambda device: 132)   # where it fuses: an H100's dispatch
    # Decode rows take the fused launch, a batch of 300 the TMA matmul and SiLU·up's own kernel;
    # 17..128 rows the fused launch where the split kernel runs (the 0.6B shape), TMA elsewhere.
    weight, batch = randn(N, K, dtype=DTYPE), randn(300, K, dtype=DTYPE)
    want = kernels.swiglu(batch, weight.t())
    assert torch.equal(want, kernels.silu_mul(kernels.matmul(batch, weight.t())))
    assert _swiglu_config(batch, weight.t()) is None
    for m in (1, 2, 7, 16, 32, 100, 256):
        assert (_swiglu_config(batch[:m], weight.t()) is not None) == (m <= 16 or (m <= 128 and N == 6144))
        for first in (0, 100 - m // 3, 300 - m):
            assert torch.equal(kernels.swiglu(batch[first:first + m], weight.t()), want[first:first + m])


def test_off_the_gpu_it_is_silu_mul_of_matmul(randn):
    a, weight = randn(3, 40, dtype=torch.float32), randn(24, 40, dtype=torch.float32)
    assert torch.equal(kernels.swiglu(a, weight.t()), kernels.silu_mul(kernels.matmul(a, weight.t())))


def test_odd_columns_are_a_value_error(randn):
    with pytest.raises(ValueError, match="gate \\| up"):
        kernels.swiglu(randn(2, 8), randn(8, 5))
