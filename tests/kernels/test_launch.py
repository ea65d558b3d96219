"""kernels.launch: a replayed launch runs the compiled kernel Triton's own launch would pick for
pointers of either alignment and integers of each class Triton specializes (1, multiples of 16,
others, past int32), ints and floats for one parameter, and constexprs; and computes what Triton's
launch computes. Under the interpreter (CPU) every launch takes Triton's own path, so there these
tests check that path; the replays run on a GPU."""
import pytest
import torch
import triton
import triton.language as tl
from triton import knobs

from kernels import launch as launch_module
from kernels.launch import Launch, cdiv, launch, next_power_of_2


@triton.jit
def _shifted_kernel(x_ptr, out_ptr, n, shift, scale, BLOCK: tl.constexpr, TWICE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    y = x * scale + shift
    if TWICE:
        y = y * 2
    tl.store(out_ptr + offs, y, mask=offs < n)


def _call(x, out, shift, scale, block, twice, launcher):
    n = x.numel()
    args = (x, out, n, shift, scale)
    launcher(_shifted_kernel, (cdiv(n, block),), *args, BLOCK=block, TWICE=twice, num_warps=1)


def _triton(fn, grid, *args, **kwargs):
    return fn[grid](*args, **kwargs)


def test_host_integer_helpers_match_triton():
    for n in range(-40, 5000):
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 16, 64, 1000):
            assert cdiv(n, d) == triton.cdiv(n, d)


# (elements, offset into the buffer: 1 leaves the pointer off 16 bytes, shift, scale, block, twice); the
# shifts cover each integer class Triton specializes on: 1, multiples of 16, others, past int32; the
# scales a float, an int and the int 1 (a constant to Triton) for one parameter.
VARIANTS = [(100, 0, 3, 0.5, 32, False), (100, 1, 3, 0.5, 32, False), (100, 0, 1, 0.5, 32, False),
            (96, 0, 16, 0.5, 32, False), (100, 0, 17, 0.5, 64, False), (100, 0, 3, 0.5, 32, True),
            (33, 3, 1 << 33, 0.5, 32, False), (16, 0, -5, 0.5, 16, True), (100, 0, 3, 2, 32, False),
            (100, 0, 3, 1, 32, False)]


@pytest.mark.parametrize("elements, offset, shift, scale, block, twice", VARIANTS)
def test_launch_computes_what_triton_does(device, randn, elements, offset, shift, scale, block, twice):
    buf = randn(elements + offset)
    x = buf[offset:]
    for _ in range(3):   # the first launch compiles and records; the others replay
        x.copy_(randn(elements))
        got, want = torch.empty_like(x), torch.empty_like(x)
        _call(x, got, shift, scale, block, twice, launch)
        _call(x, want, shift, scale, block, twice, _triton)
        assert torch.equal(got, want)


def test_replayed_kernel_is_the_one_triton_picks(gpu, randn):
    """For each variant, the compiled kernel replayed is the object Triton's own launch returns:
    the key tells apart at least what Triton's specialization does."""
    seen = {}
    for elements, offset, shift, scale, block, twice in VARIANTS:
        x = randn(elements + offset)[offset:]
        out = torch.empty_like(x)
        _call(x, out, shift, scale, block, twice, launch)
        picked = _shifted_kernel[(cdiv(elements, block),)](x, out, elements, shift, scale, BLOCK=block, TWICE=twice,
                                                            num_warps=1)
        kernel = launch_module._kernels[id(_shifted_kernel)][1]
        key = launch_module._key(torch.cuda.current_device(), (x, out, elements, shift, scale),
                                 {"BLOCK": block, "TWICE": twice, "num_warps": 1})
        assert kernel.compiled[key] is picked
        seen[key] = picked
    assert len({id(k) for k in seen.values()}) > 4   # the variants did compile apart


def test_replayed_launch_is_captured_by_a_cuda_graph(gpu, randn):
    x, out = randn(100), torch.empty(100, device="cuda")
    for _ in range(2):
        _call(x, out, 3, 0.5, 32, False, launch)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call(x, out, 3, 0.5, 32, False, launch)
    x.copy_(randn(100))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 0.5 + 3)


def test_a_launch_hook_sees_every_launch(gpu, randn):
    """A profiler's hook (proton, say) is called as for Triton's own launches."""
    x, out, names = randn(64), torch.empty(64, device="cuda"), []

    def hook(metadata):
        names.append(metadata.get()["name"])

    for _ in range(2):
        _call(x, out, 3, 0.5, 32, False, launch)
    chain = knobs.runtime.launch_enter_hook   # a chain from Triton 3.6, before it one hook or None
    if hasattr(chain, "add"):
        chain.add(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
    try:
        _call(x, out, 3, 0.5, 32, False, launch)
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            knobs.runtime.launch_enter_hook = chain
    assert names == ["_shifted_kernel"]


def test_equal_values_of_other_types_key_apart():
    """1, 1.0 and True are equal in Python, but as arguments Triton compiles them apart (the constant
    1, fp32, i1)."""
    keys = {launch_module._key(0, (v,), {}) for v in (1, 1.0, True)}
    assert len(keys) == 3
    assert len({launch_module._key(0, (), {"BLOCK": v}) for v in (1, 1.0, True)}) == 3


@pytest.mark.parametrize("elements, offset, shift, scale, block, twice", VARIANTS)
def test_bound_launch_computes_what_triton_does(device, randn, elements, offset, shift, scale, block, twice):
    """A Launch fixes all but the tensors; its replays give Triton's results, for Triton's kernel."""
    bound = Launch(_shifted_kernel, (cdiv(elements, block),), (elements, shift, scale), BLOCK=block, TWICE=twice,
                   num_warps=1)
    buf = randn(elements + offset)
    x = buf[offset:]
    for _ in range(3):
        x.copy_(randn(elements))
        got, want = torch.empty_like(x), torch.empty_like(x)
        bound(x, got)
        _call(x, want, shift, scale, block, twice, _triton)
        assert torch.equal(got, want)
    if device == "cuda":
        picked = _shifted_kernel[bound.grid](x, got, elements, shift, scale, BLOCK=block, TWICE=twice, num_warps=1)
        key = (torch.cuda.current_device(), (x.dtype, x.data_ptr() % 16 == 0), (got.dtype, True))
        assert bound.compiled[key] is picked
