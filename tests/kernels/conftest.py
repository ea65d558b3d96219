"""Shared fixtures for kernel tests.

Without CUDA the Triton kernels run under the interpreter, which must be
switched on before any kernel module is imported (triton.jit reads it when a
kernel is defined), so it is set here, at collection, rather than in a fixture.
"""
import importlib
import os
import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def gpu() -> None:
    """Request this fixture in tests that need real sizes on a real GPU."""
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded from the test's id: every test draws its own fixed inputs."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def randn(gen, device):
    """randn(*shape, dtype=...) -> a tensor on the test device, drawn from `gen`."""
    def draw(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return draw


@pytest.fixture
def small_segments(monkeypatch):
    """The matmul's split rule at any size: a segment per BLOCK_K step, as many as there are steps,
    so that the split launch runs at the interpreter's small K and on shapes that have one segment."""
    matmul_module = importlib.import_module("kernels.matmul")   # not the function `kernels` exports
    monkeypatch.setattr(matmul_module, "_MIN_SEGMENT_STEPS", 1)
    monkeypatch.setattr(matmul_module, "_SPLIT_PROGRAMS", 1 << 20)
