"""The fused q/k norm + RoPE + KV write gives the unfused steps' bits (kernels.rms_norm per
head, RoPE in torch, kernels.store_kv), for q and for what lands in the caches."""
import pytest
import torch

from kernels.rotary import rope_store_kv, rope_store_kv_reference

HAS_CUDA = torch.cuda.is_available()
# The interpreter casts fp32 to bf16 by truncation (the GPU rounds to nearest even): bf16 on a GPU only.
DTYPES = (torch.bfloat16, torch.float16) if HAS_CUDA else (torch.float16, torch.float32)
SHAPES = [(16, 8, 128), (32, 8, 128), (4, 2, 64)] if HAS_CUDA else [(4, 2, 16), (2, 2, 32)]
TOKENS = 300 if HAS_CUDA else 5


def tables(positions: int, d: int, device):
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv)
    return angles.cos().float().to(device), angles.sin().float().to(device)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", SHAPES)
def test_fused_equals_unfused_bit_for_bit(heads, kv_heads, d, dtype, norm, randn, gen, device):
    page, blocks = 16, 64
    qkv = randn(TOKENS, (heads + 2 * kv_heads) * d + 8, dtype=dtype)[:, 8:] * 3   # strided rows
    positions = torch.randint(0, 4000, (TOKENS,), generator=gen).to(device)
    slots = torch.randperm(blocks * page, generator=gen)[:TOKENS].to(device)
    slots[::3] = -1   # padding rows write nothing
    cos, sin = tables(4096, d, device)
    weights = (randn(d, dtype=dtype), randn(d, dtype=dtype)) if norm else (None, None)
    start = [randn(blocks, page, kv_heads, d, dtype=dtype) for _ in range(2)]
    caches = [[c.clone() for c in start] for _ in range(2)]
    outs = [f(qkv, positions, cos, sin, *cache, slots, heads, kv_heads, *weights, 1e-6)
            for f, cache in zip((rope_store_kv, rope_store_kv_reference), caches)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
