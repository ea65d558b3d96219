"""A kernel that lets the decode matmul behind it launch at its top (`early`: the norm and the
attention fold) hands that matmul the same input, so the same bits: the matmul still waits for
its writes. On a GPU, where dependent launches run; elsewhere `early` is off, which the gate
test states."""
import pytest
import torch

import kernels
from kernels.attention_triton import paged_attention_triton
from kernels.device import dependent_launch, early_launch

BF16 = torch.bfloat16


def test_early_only_for_decode_rows_where_dependent_launches_run(device):
    one, many = torch.zeros(1, 8, device=device), torch.zeros(17, 8, device=device)
    assert not early_launch(False, one) and not early_launch(True, many)
    assert early_launch(True, one) == dependent_launch(one.device)


@pytest.mark.parametrize("shape,early", [((1024, 4096), True), ((3072, 1024), True), ((4096, 6144), False),
                                         ((4096, 28672), False)])
def test_small_weights_launch_early(shape, early):
    # The 0.6B shape's qkv and down, the 8B shape's qkv and gate_up.
    assert kernels.launches_early(torch.empty(shape, dtype=BF16, device="meta")) == early


def test_matmuls_behind_early_kernels_get_the_same_bits(randn, gpu):
    h, heads, kv_heads, d, kv_len, page = 1024, 16, 8, 128, 300, 16
    x, res, norm_w = randn(1, h, dtype=BF16), randn(1, h, dtype=BF16), randn(h, dtype=BF16)
    qkv_w, o_w = (randn(n, k, dtype=BF16).t() for n, k in ((4096, h), (h, heads * d)))
    blocks = -(-kv_len // page)
    k_cache, v_cache = randn(blocks, page, kv_heads, d, dtype=BF16), randn(blocks, page, kv_heads, d, dtype=BF16)
    q = randn(1, heads, d, dtype=BF16)
    tables = torch.arange(blocks, dtype=torch.int32, device="cuda").view(1, -1)
    cu_q, kv_lens = (torch.tensor(v, dtype=torch.int32, device="cuda") for v in ([0, 1], [kv_len]))

    def run(early: bool) -> list[torch.Tensor]:
        normed, _ = kernels.rms_norm_residual(x, res, norm_w, 1e-6, early=early)
        o = paged_attention_triton(q, k_cache, v_cache, tables, cu_q, kv_lens, d ** -0.5, max_q_len=1,
                                   max_kv_len=kv_len, split_per_program=True, early=early)
        return [kernels.matmul(normed, qkv_w), kernels.matmul(o.reshape(1, -1), o_w)]

    want = run(False)
    for _ in range(5):
        assert all(torch.equal(a, b) for a, b in zip(run(True), want))
