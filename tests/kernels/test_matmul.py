import importlib
import random

import pytest
import torch

import kernels
from kernels.matmul import CONFIGS, _matmul_triton, k_segments, matmul, matmul_reference
from kernels.mode import mode

# The module, not the function that `kernels` exports under the same name.
matmul_module = importlib.import_module("kernels.matmul")

# Under the interpreter: tiny sizes, fp16/fp32 (its bf16 dot is wrong), K not a
# multiple of BLOCK_K so the K tail is exercised. Its fp32 dot is a BLAS call
# whose summation order depends on where a row sits in the block, so the
# interpreter can only check the bit property in fp16. On a GPU: model shapes.
if torch.cuda.is_available():
    DTYPES = (torch.bfloat16, torch.float16)
    BIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
    # (K, N): Llama-3-8B's; Qwen3-0.6B's qkv and down, and a K that ends inside a BLOCK_K step, whose
    # decode segments are 8 steps.
    SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (1024, 4096), (3072, 1024), (1000, 1024))
    BATCH_SIZES = (1, 2, 3, 7, 16, 31, 64, 65, 127, 128, 200, 256, 511, 1024, 1500, 2048, 4096, 8192)
    TRIALS = 24
else:
    DTYPES = (torch.float16, torch.float32)
    BIT_DTYPES = (torch.float16,)
    SHAPES = ((96, 48), (160, 72))
    BATCH_SIZES = (1, 2, 5, 16, 33, 64, 130, 300)
    TRIALS = 16

# ||out - ref|| / ||ref|| against fp64: one rounding of the output dominates.
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", BIT_DTYPES)
@pytest.mark.parametrize("K,N", SHAPES)
def test_row_bits_do_not_depend_on_the_batch(K, N, dtype, randn, gen):
    # The property: row i alone == row i at a random position among random rows.
    rng = random.Random(gen.initial_seed())
    weight, bias = randn(N, K, dtype=dtype), randn(N, dtype=dtype)
    row = randn(1, K, dtype=dtype)
    alone = kernels.matmul(row, weight.t(), bias)
    for _ in range(TRIALS):
        m = rng.choice(BATCH_SIZES)
        pos = rng.randrange(m)
        batch = randn(m, K, dtype=dtype)
        batch[pos] = row[0]
        assert torch.equal(kernels.matmul(batch, weight.t(), bias)[pos], alone[0]), (m, pos)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_tile_config_gives_the_same_bits(dtype, randn, gpu):
    # The dispatch may pick a different tile shape for each M; that is only
    # allowed because all of them sum K identically on the GPU's MMA
    # instructions, which this checks. (The interpreter's numpy dot rounds
    # differently per block shape, so it uses one shape and cannot run this.)
    K, N = SHAPES[0]
    assert k_segments(K, N, dtype)[0] > 1   # so that the split kernel runs too
    a, weight = randn(max(BATCH_SIZES[:6]), K, dtype=dtype), randn(N, K, dtype=dtype)
    first = None
    for config in CONFIGS.values():
        for kernel in ("tma", "pointer", "split"):
            out = _matmul_triton(a, weight.t(), None, (*config[:4], kernel))
            first = out if first is None else first
            assert torch.equal(out, first), (config, kernel)


@pytest.mark.parametrize("with_bias", (False, True))
def test_split_programs_add_segments_as_one_program_does(with_bias, randn, small_segments):
    # The split kernel gives each K segment its own program, the last of a tile adding their
    # sums; a large batch adds them inside one program. Same tile, same bits (fp16: see above).
    dtype = BIT_DTYPES[0]
    K, N = SHAPES[1]
    assert k_segments(K, N, dtype)[0] > 1
    a, weight, bias = randn(5, K, dtype=dtype), randn(N, K, dtype=dtype), randn(N, dtype=dtype)
    bias = bias if with_bias else None
    tile = CONFIGS["decode"][:4]
    split = _matmul_triton(a, weight.t(), bias, (*tile, "split"))
    assert torch.equal(split, _matmul_triton(a, weight.t(), bias, (*tile, "pointer")))
    assert torch.equal(split, _matmul_triton(a, weight.t(), bias, (*tile, "split")))   # its counts start at zero again
    assert rel_err(split, a.double() @ weight.t().double() + (bias.double() if with_bias else 0)) < REL_TOL[dtype]


@pytest.mark.parametrize("K,N", SHAPES)
def test_row_bits_do_not_depend_on_the_batch_with_segments(K, N, randn, gen, small_segments):
    test_row_bits_do_not_depend_on_the_batch(K, N, BIT_DTYPES[0], randn, gen)


def test_segments_depend_on_k_and_n_only():
    for dtype in (torch.bfloat16, torch.float32):
        for K, N in ((1024, 1024), (2048, 1024), (4096, 4096), (14336, 4096), (1024, 151936), (100, 7)):
            segments, per = k_segments(K, N, dtype)
            steps = -(-K // matmul_module.BLOCK_K[dtype])
            assert segments >= 1 and (segments - 1) * per < steps <= segments * per   # no empty segment
    assert k_segments(14336, 4096, torch.bfloat16) == (4, 56)   # an 8B down projection
    assert k_segments(1024, 151936, torch.bfloat16) == (1, 16)  # an LM head: its N fills the GPU
    assert k_segments(0, 64, torch.bfloat16)[0] == 0 and k_segments(64, 0, torch.bfloat16)[0] == 1   # empty


def test_decode_tile_follows_the_weights():
    # Decode rows pick their tile by the weights alone (no GPU is asked): small weights whose K
    # splits take the tile with more loads in flight; large ones, one-segment products and SiLU·up's
    # fused product, the other.
    def config(m, K, N, gated=False):
        segments = k_segments(K, N, torch.bfloat16)[0]
        return matmul_module._config(m, N, K, torch.bfloat16, torch.device("cuda"), segments, gated)
    for K, N in ((1024, 4096), (2048, 1024), (3072, 1024)):   # the 0.6B qkv, o and down projections
        assert config(1, K, N) == config(8, K, N) == CONFIGS["decode_small"]
    for K, N in ((1024, 151936), (4096, 6144), (14336, 4096)):   # the 0.6B LM head; the 8B qkv and down
        assert config(1, K, N) == CONFIGS["decode"]
    assert config(1, 1024, 6144, gated=True) == CONFIGS["decode"]   # the 0.6B gate_up
    assert config(16, 1024, 4096) == CONFIGS["decode16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", (False, True))
@pytest.mark.parametrize("K,N", SHAPES[:2])
def test_matches_fp64_reference(K, N, with_bias, dtype, randn):
    a, b = randn(BATCH_SIZES[4], K, dtype=dtype), randn(K, N, dtype=dtype)
    bias = randn(N, dtype=dtype) if with_bias else None
    ref = a.double() @ b.double() + (bias.double() if with_bias else 0)
    assert rel_err(matmul(a, b, bias), ref) < REL_TOL[dtype]


@pytest.mark.parametrize("layout", ("transposed_weight", "strided_slices"))
def test_any_strides(layout, randn):
    dtype = DTYPES[0]
    K, N = SHAPES[0]
    M = BATCH_SIZES[5]
    if layout == "transposed_weight":
        a, b = randn(M, K, dtype=dtype), randn(N, K, dtype=dtype).t()
    else:
        # Every other column of a wider a, and b with an odd row pitch: neither
        # is acceptable to the copy engine, so the pointer kernel runs.
        a = randn(M, 2 * K, dtype=dtype)[:, ::2]
        b = randn(K, N + 3, dtype=dtype)[:, :N]
    out = matmul(a, b)
    assert out.is_contiguous()
    assert rel_err(out, a.double() @ b.double()) < REL_TOL[dtype]


def test_edge_sizes(randn):
    dtype = DTYPES[0]
    b, bias = randn(40, 24, dtype=dtype), randn(24, dtype=dtype)
    assert matmul(randn(0, 40, dtype=dtype), b).shape == (0, 24)
    assert matmul(randn(2, 40, dtype=dtype), b[:, :0]).shape == (2, 0)
    assert torch.equal(matmul(randn(3, 0, dtype=dtype), randn(0, 24, dtype=dtype), bias), bias.expand(3, 24))
    single_col = matmul(randn(5, 40, dtype=dtype), b[:, :1])
    assert single_col.shape == (5, 1)


@pytest.mark.parametrize("a_shape,b_shape,dtypes,bias_shape", [
    ((4, 8), (9, 16), (torch.float16, torch.float16), None),
    ((4, 8, 1), (8, 16), (torch.float16, torch.float16), None),
    ((4, 8), (8, 16), (torch.float16, torch.float32), None),
    ((4, 8), (8, 16), (torch.int32, torch.int32), None),
    ((4, 8), (8, 16), (torch.float16, torch.float16), (15,)),
])
def test_bad_input_is_a_value_error(a_shape, b_shape, dtypes, bias_shape):
    a = torch.zeros(a_shape, dtype=dtypes[0])
    b = torch.zeros(b_shape, dtype=dtypes[1])
    bias = torch.zeros(bias_shape, dtype=dtypes[0]) if bias_shape else None
    with pytest.raises(ValueError):
        matmul(a, b, bias)


def test_standard_mode_is_the_vendor_matmul(randn):
    dtype = DTYPES[0]
    a, b, bias = randn(9, 64, dtype=dtype), randn(64, 32, dtype=dtype), randn(32, dtype=dtype)
    with mode("standard"):
        out = matmul(a, b, bias)
    assert torch.equal(out, torch.addmm(bias, a, b))


def test_reference_path_without_gpu_or_interpreter(monkeypatch, randn, device):
    if device == "cuda":
        pytest.skip("CUDA tensors always take the Triton path in invariant mode")
    monkeypatch.delenv("TRITON_INTERPRET")
    a, b = randn(5, 64, dtype=torch.float32), randn(64, 8, dtype=torch.float32)
    assert torch.equal(matmul(a, b), matmul_reference(a, b))
