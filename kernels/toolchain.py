"""What turns the kernels' source into bits besides the source: the compiler stack.

The same kernels on the same H100 gave 5 of 11 outputs with other bits under Triton 3.9
than under 3.6 (bench/results/cross_gpu.md): in a tl.sum, 3.9 adds a thread's elements as a
tree where 3.6 chained them. So a result is reproducible for a (KERNEL_VERSION, toolchain)
pair, and the backend's fingerprint names both.
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.backends.nvidia.compiler import get_ptxas

# Whether Triton may contract a * b + c into one FMA where a kernel does not say. Its default
# is on up to 3.9 and off from 3.10, so every launch names it: an upgrade must not flip it
# unseen. Kernels that keep each rounding apart pass False themselves.
FP_FUSION = True


def toolchain(device: torch.device) -> str:
    """What fixes a kernel's bits on `device`: torch (and its CUDA), Triton, and the ptxas Triton
    assembles with for that GPU; on the CPU, the vector width torch's kernels pick for this
    processor and the thread count that splits their reductions (one thread and two give the
    SmolLM2 checkpoint other last bits)."""
    parts = [f"torch {torch.__version__}", f"triton {triton.__version__}"]
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        parts += [f"cuda {torch.version.cuda}", f"ptxas {_ptxas(major * 10 + minor)}"]
    else:
        parts += [f"cpu {torch.backends.cpu.get_cpu_capability()}", f"{torch.get_num_threads()} threads"]
    return ", ".join(parts)


@functools.lru_cache(maxsize=None)
def _ptxas(arch: int) -> str:
    # Triton picks the assembler per architecture: its own, or one a TRITON_PTXAS_*_PATH names.
    return get_ptxas(arch).version
