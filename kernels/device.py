"""What the kernel wrappers size and shape their launches by, looked up once per device: the GPU's SM
count, and whether it takes programmatic dependent launches."""
from __future__ import annotations

import functools
from types import MappingProxyType

import torch
import triton
import triton.language as tl
import triton.language.extra.cuda as triton_cuda


def _index(device: torch.device) -> int:
    # An index-less CUDA device means the current one.
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device."""
    return _sm_count(_index(device))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# A decode step's rows: the matmul's decode tiles take at most this many (kernels.matmul), and
# early launches (early_launch) were measured there.
DECODE_ROWS = 16


def dependent_launch(device: torch.device) -> bool:
    """Whether a kernel may launch before the one ahead of it ends (programmatic dependent launch:
    sm_90 and later, and a Triton that has griddepcontrol). The decode path's kernels launch so
    and wait (griddepcontrol.wait) before touching memory: the launch overlaps the kernel ahead's
    drain, and nothing is read or written early, so no bit changes (bench/results/
    backend_step_ahead_ab.md: one 0.6B request's forward 1,297 -> 1,256 us on an H200)."""
    return device.type == "cuda" and _dependent_launch(_index(device))


@functools.lru_cache(maxsize=None)
def _dependent_launch(index: int) -> bool:
    # A Triton without griddepcontrol also predates the launch_pdl option.
    return torch.cuda.get_device_capability(index)[0] >= 9 and hasattr(triton_cuda, "gdc_wait")


def dependent_launch_options(device: torch.device, on: bool = True) -> dict:
    """A launch's PDL constexpr (the kernel's wait_for_kernel_ahead) and Triton's launch_pdl,
    which must agree: on, where the device takes dependent launches."""
    return _PDL_OPTIONS[on and dependent_launch(device)]


# Shared, not built per call, and read-only.
_PDL_OPTIONS = {pdl: MappingProxyType({"PDL": pdl, "launch_pdl": pdl}) for pdl in (False, True)}


def early_launch(early: bool, x: torch.Tensor) -> bool:
    """EARLY for a kernel over the rows of x whose caller asks for `early` (a matmul that gains
    follows: kernels.matmul.launches_early): only where dependent launches run, and at decode
    (at most DECODE_ROWS rows), the one place it was measured."""
    return early and x.shape[0] <= DECODE_ROWS and dependent_launch(x.device)


@triton.jit
def let_dependents_launch(EARLY: tl.constexpr):
    """At a kernel's top, with EARLY: the kernel behind it, a dependent launch, may launch now
    instead of once this one drains. It still waits for this one's writes before it reads them
    (wait_for_kernel_ahead), so no bit moves."""
    if EARLY:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_kernel_ahead(PDL: tl.constexpr):
    """In a kernel launched with launch_pdl=PDL (dependent_launch), before it touches memory:
    the kernel ahead may still be running, and its writes are visible from here."""
    if PDL:
        tl.extra.cuda.gdc_wait()
