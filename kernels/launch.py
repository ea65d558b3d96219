"""An eager kernel call's host side: grid arithmetic, and a launch that costs little more than the
driver's.

Outside a CUDA graph (the kernels used from eager PyTorch, --no-cuda-graphs) a decode-size call's
host time, not its GPU time, sets the pace (bench/results/kernels_host_*.md). Triton's own launch
binds and specializes every argument, builds a cache key from them and a string of the options,
and builds launch metadata for its hooks, on every call. `launch` keys a call by the arguments
themselves (a tensor by its dtype and 16-byte alignment, which is all Triton's specialization reads
of it; any other argument by its type and value, which decide whatever Triton reads of it: 1, 1.0
and True compile apart), the constexprs and options likewise, and the current device, and hands
the arguments straight to the compiled kernel that Triton's own launch returned the first time it
saw that key. The same compiled kernel, so the same bits. (A tuple argument is keyed by its value,
as Triton 3.6 keys its own cache; none is passed here. A TMA descriptor is not hashable: those
launches take Triton's path every time.)
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction


def cdiv(a: int, b: int) -> int:
    """Ceiling division. triton.cdiv is a constexpr function since Triton 3.4: a host call wraps and
    unwraps its arguments as compiler constants, a few microseconds each."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """triton.next_power_of_2 on the host: the smallest power of two at least n, 0 for n <= 0."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


class _Kernel:
    """A JIT function's runtime parameters, which all precede its constexprs, and the compiled
    kernels Triton's launch gave it, per key."""

    def __init__(self, runtime: int, constexprs: int):
        self.runtime = runtime
        # The launcher skips a constexpr's slot, but each parameter needs one.
        self.constexpr_slots = (None,) * constexprs
        self.compiled: dict[tuple, object] = {}


# Per JIT function, by id (its hash is computed in Python): the function, and None where launches
# go through Triton's own path (the interpreter's functions, and a constexpr ahead of a runtime
# parameter, whose slots a call's arguments would not line up with).
_kernels: dict[int, tuple[object, _Kernel | None]] = {}
_MISSING = object()
# Keys are per value, so per shape: a process that sees many shapes starts over past this many.
_MAX_KEYS = 4096


def _kernel(fn) -> _Kernel | None:
    """fn's record where its launches can be keyed here; None where Triton's own launch runs them
    (the interpreter's functions are not JITFunctions)."""
    known, kernel = _kernels.get(id(fn), (None, None))
    if known is not fn:
        kernel = None
        if isinstance(fn, JITFunction) and not knobs.runtime.interpret:
            constexpr = [p.is_constexpr for p in fn.params]
            runtime = constexpr.index(True) if True in constexpr else len(constexpr)
            if all(constexpr[runtime:]):
                kernel = _Kernel(runtime, len(constexpr) - runtime)
        _kernels[id(fn)] = fn, kernel
    return kernel


def _triton_path(fn) -> bool:
    """Whether this call must take Triton's own launch, for what it does per call that a replay
    would skip: a profiler's launch hooks (proton, say) see its launches; a debug or instrumentation
    mode, or a stages-inspection hook (3.9), changes what it compiles; pre-run hooks run; and it
    refuses a kernel whose globals changed since the compile. Triton 3.4 and 3.5 keep one launch
    hook or None, 3.6 on a chain of them."""
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    if (getattr(enter, "calls", enter) or getattr(leave, "calls", leave) or runtime.debug
            or getattr(knobs.compilation, "instrumentation_mode", "") or getattr(fn, "pre_run_hooks", None)
            or getattr(runtime, "add_stages_inspection_hook", None)):
        return True
    for (name, _), (value, scope) in fn.used_global_vals.items():
        if scope.get(name, _MISSING) != value:
            return True
    return False


def _first(compiled_by_key: dict, key: tuple, fn, grid, args: tuple, kwargs: dict) -> None:
    """Triton's own launch, whose compiled kernel the key replays from then on."""
    compiled = fn[grid](*args, **kwargs)
    if compiled is not None:
        if len(compiled_by_key) >= _MAX_KEYS:
            compiled_by_key.clear()
        # A compile handed to a worker (Triton's async mode) is waited for once, here.
        compiled_by_key[key] = compiled.result() if hasattr(compiled, "result") else compiled


def _grid3(grid: tuple[int, ...]) -> tuple[int, int, int]:
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def launch(fn, grid: tuple[int, ...], *args, **kwargs) -> None:
    """fn[grid](*args, **kwargs), with the runtime arguments by position and constexprs and options
    by keyword."""
    kernel = _kernel(fn)
    if kernel is None or len(args) != kernel.runtime or _triton_path(fn):
        fn[grid](*args, **kwargs)
        return
    device = driver.active.get_current_device()
    key = _key(device, args, kwargs)
    try:
        compiled = kernel.compiled.get(key)
    except TypeError:   # an unhashable argument (a TMA descriptor): Triton's own launch
        fn[grid](*args, **kwargs)
        return
    if compiled is None:
        _first(kernel.compiled, key, fn, grid, args, kwargs)
        return
    compiled.run(*_grid3(grid), driver.active.get_current_stream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *args, *kernel.constexpr_slots)


def _key(device: int, args: tuple, kwargs: dict) -> tuple:
    return (device, *[a if a.__class__ is int else (a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                      else (a.__class__, a) for a in args], *kwargs.items(), *map(type, kwargs.values()))


class Launch:
    """A launch whose grid, scalar arguments, constexprs and options are fixed, given the tensors
    that lead its arguments per call: what a wrapper computes once per shape and keeps (an
    lru_cache), so that a call keys on its tensors alone."""

    def __init__(self, fn, grid: tuple[int, ...], scalars: tuple, **kwargs):
        self.fn, self.grid, self.scalars, self.kwargs = fn, grid, scalars, kwargs
        kernel = _kernel(fn)
        self.kernel = kernel if kernel is not None and kernel.runtime > len(scalars) else None
        self.grid3 = _grid3(grid)
        self.tail = (*scalars, *kernel.constexpr_slots) if self.kernel else ()
        self.compiled: dict[tuple, object] = {}

    def __call__(self, *tensors: torch.Tensor) -> None:
        if self.kernel is None or len(tensors) + len(self.scalars) != self.kernel.runtime or _triton_path(self.fn):
            self.fn[self.grid](*tensors, *self.scalars, **self.kwargs)
            return
        device = driver.active.get_current_device()
        key = (device, *[(t.dtype, t.data_ptr() % 16 == 0) for t in tensors])
        compiled = self.compiled.get(key)
        if compiled is None:
            _first(self.compiled, key, self.fn, self.grid, (*tensors, *self.scalars), self.kwargs)
            return
        compiled.run(*self.grid3, driver.active.get_current_stream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *tensors, *self.tail)
