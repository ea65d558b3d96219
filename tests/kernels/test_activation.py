"""silu_mul gives torch's `F.silu(gate) * up` bits: on a GPU for every finite bf16 and fp16 gate
value (the fused kernel), on the CPU through torch itself."""
import pytest
import torch
import torch.nn.functional as F

import kernels


def every_finite(dtype: torch.dtype) -> torch.Tensor:
    x = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    return x[torch.isfinite(x)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_gate_value_gives_torch_s_bits(dtype, gpu, gen):
    gate = every_finite(dtype).cuda()
    up = (torch.randn(gate.shape[0], generator=gen) * 4).to(dtype).cuda()
    for width in (gate.shape[0], 3072):   # one long row; rows of a model's width (and a ragged tail)
        n = gate.shape[0] // width * width
        x = torch.cat([gate[:n].view(-1, width), up[:n].view(-1, width)], dim=1)
        want = F.silu(x[:, :width]) * x[:, width:]
        assert torch.equal(kernels.silu_mul(x).view(torch.int16), want.view(torch.int16))


def test_cpu_path_is_torch(randn):
    x = randn(5, 48)
    assert torch.equal(kernels.silu_mul(x), F.silu(x[:, :24]) * x[:, 24:])
