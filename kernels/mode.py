"""The invariant/standard switch that every public kernel entry point consults.

`invariant` runs the batch-invariant Triton kernels on CUDA tensors (and on CPU
tensors under TRITON_INTERPRET=1, for tests), falling back to the plain-torch
references elsewhere. `standard` runs the vendor path (cuBLAS, SDPA, torch
sampling) so the cost of invariance can be measured inside the same engine.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Literal

Mode = Literal["invariant", "standard"]
_MODES = ("invariant", "standard")
_current: Mode = "invariant"


def set_mode(mode: Mode) -> None:
    global _current
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, not {mode!r}")
    _current = mode


def get_mode() -> Mode:
    return _current


@contextlib.contextmanager
def mode(m: Mode) -> Iterator[None]:
    previous = _current
    set_mode(m)
    try:
        yield
    finally:
        set_mode(previous)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(*tensors) -> bool:
    """True when the invariant Triton path should run for these tensors."""
    if _current != "invariant":
        return False
    for t in tensors:   # a loop, not all(): this runs on every eager call
        if not t.is_cuda:
            return interpreting()
    return True
