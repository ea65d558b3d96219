"""A layer's four decode matmuls as one persistent launch with grid barriers, against four launches.

The question before a fused decoder layer (issue 25: 1,500 tokens/s at one 0.6B request needs a
layer in about the time its four matmuls take today): does a phase boundary inside one kernel
cost less than a launch boundary? Each variant is a CUDA graph of all of a model's layers at one
row, every layer its own weights (they stream from memory, as in a step):
- launches: the four split launches as the engine makes them (kernels.matmul_partials), gate_up
  handed on as Partials too, so that every variant does the same work.
- persistent: one launch a layer, a program per SM (or two where two fit); a phase a matmul, whose
  (column tile, K segment) items are the split kernel's programs; a grid barrier between phases.
- persistent, prefetch: before each barrier a program asks L2 for the weight lines of its items in
  the next phase (they depend on nothing the barrier waits for).
- persistent, no barriers: what streaming the phases alone takes; a bound, not a layer.
- streamed (CUDA, bench/kernels_stream_layer.cu, built with nvcc): a producer warp per SM streams
  every phase's weight tiles into a shared-memory ring without stopping at the barriers, four
  warps multiply; with flags that drop the barriers or the math, to see what each costs.
The phases' inputs are fixed rows, not the phase before's output: the barriers stand for the
dependences a layer has. Each phase stores the split kernel's segment sums, so the bits must equal
matmul_partials'; the table says whether they do.

    python3 bench/kernels_persistent_layer.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels.device import sm_count  # noqa: E402
from kernels.matmul import BLOCK_K, CONFIGS, k_segments  # noqa: E402
from kernels.partials import Partials  # noqa: E402
from kernels_batch_split import SHAPES, layers  # noqa: E402
from kernels_dense import gpu_us  # noqa: E402
from md_table import markdown_table  # noqa: E402

BLOCK_M, BLOCK_N, WARPS, STAGES = CONFIGS["decode"][:4]
# A grid barrier spins at most this many polls, so that programs that are not all resident end
# with wrong sums (the bits column) instead of a hung GPU.
_MAX_POLLS = 1 << 16
# The CUDA variant's (ring stages of 9 KB, tile columns, flags): 1 no grid barriers (a bound), 2 no MMAs
# (the consumers only hand stages back: what streaming alone takes).
STREAMED = ((8, 64, 0), (4, 64, 0), (16, 64, 0), (8, 32, 0), (8, 64, 1), (8, 64, 2), (8, 64, 3), (16, 64, 3),
            (8, 32, 3))


@triton.jit
def _phase(a_ptr, b_ptr, parts_ptr, M, N, K, SEGMENTS, SEGMENT_STEPS, stride_am, stride_bk, stride_bn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The split kernel's programs (kernels.matmul._matmul_kernel, PARTIAL), walked by this one."""
    offs_m = tl.arange(0, BLOCK_M)
    rows = offs_m % M
    offs_k = tl.arange(0, BLOCK_K)
    steps = tl.cdiv(K, BLOCK_K)
    for item in range(tl.program_id(0), tl.cdiv(N, BLOCK_N) * SEGMENTS, tl.num_programs(0)):
        segment = item % SEGMENTS
        offs_n = (item // SEGMENTS) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
        first = segment * SEGMENT_STEPS
        a_ptrs = a_ptr + rows[:, None] * stride_am + (first * BLOCK_K + offs_k)[None, :]
        b_ptrs = b_ptr + (first * BLOCK_K + offs_k)[:, None].to(tl.int64) * stride_bk + cols[None, :] * stride_bn
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(first, tl.minimum(first + SEGMENT_STEPS, steps)):
            part = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), part)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * stride_bk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc += part   # the split kernel's `acc += part`: a -0 sum is stored as +0 there too
        tl.store(parts_ptr + segment * M * N + offs_m[:, None] * N + offs_n[None, :], acc,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _prefetch(b_ptr, N, SEGMENTS, SEGMENT_STEPS, stride_bn, STEPS: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """prefetch.global.L2 of this program's items' weight lines in a phase of B stored column by column
    (stride_bk 1, as the engine's transposed nn.Linear weights): a BLOCK_K step of a column is a line."""
    for item in range(tl.program_id(0), tl.cdiv(N, BLOCK_N) * SEGMENTS, tl.num_programs(0)):
        cols = ((item // SEGMENTS) * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        s = (item % SEGMENTS) * SEGMENT_STEPS + tl.minimum(tl.arange(0, STEPS), SEGMENT_STEPS - 1)
        lines = b_ptr + (s * BLOCK_K).to(tl.int64)[:, None] + cols.to(tl.int64)[None, :] * stride_bn
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [lines], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _grid_barrier(counts_ptr, index: tl.constexpr, MAX_POLLS: tl.constexpr):
    """Every program past its phase before any goes on. Three counters used in turn: the last to
    arrive at one zeroes the one before, which every program has left by then (and the third is
    zeroed at the next launch's first barrier)."""
    tl.debug_barrier()   # every thread's stores before the arrival (release below)
    n = tl.num_programs(0)
    seen = tl.atomic_add(counts_ptr + index, 1, sem="acq_rel") + 1
    if seen == n:
        tl.store(counts_ptr + (index + 2) % 3, 0)
    polls = 0
    while (seen < n) & (polls < MAX_POLLS):
        seen = tl.atomic_add(counts_ptr + index, 0, sem="acquire")
        polls += 1
    tl.debug_barrier()


@triton.jit
def _between(next_b, next_n, next_segments, next_steps, next_k, counts_ptr, index: tl.constexpr,
             BARRIERS: tl.constexpr, PREFETCH: tl.constexpr, MAX_POLLS: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Between two phases: the next one's weight lines asked of L2 (PREFETCH), then the grid barrier."""
    if PREFETCH:
        _prefetch(next_b, next_n, next_segments, next_steps, next_k, 8, BLOCK_N, BLOCK_K)
    if BARRIERS:
        _grid_barrier(counts_ptr, index, MAX_POLLS)


@triton.jit
def _layer_kernel(
    x_ptr, qkv_ptr, attn_ptr, o_ptr, x2_ptr, gate_up_ptr, act_ptr, down_ptr,
    qkv_parts, o_parts, gate_up_parts, down_parts, counts_ptr,
    M, H, QKV, O_K, GU, I,
    S_QKV, T_QKV, S_O, T_O, S_GU, T_GU, S_D, T_D,
    BARRIERS: tl.constexpr, PREFETCH: tl.constexpr, MAX_POLLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # B operands are transposed [N, K] weights: stride_bk 1, stride_bn K.
    _phase(x_ptr, qkv_ptr, qkv_parts, M, QKV, H, S_QKV, T_QKV, H, 1, H, BLOCK_M, BLOCK_N, BLOCK_K)
    _between(o_ptr, H, S_O, T_O, O_K, counts_ptr, 0, BARRIERS, PREFETCH, MAX_POLLS, BLOCK_N, BLOCK_K)
    _phase(attn_ptr, o_ptr, o_parts, M, H, O_K, S_O, T_O, O_K, 1, O_K, BLOCK_M, BLOCK_N, BLOCK_K)
    _between(gate_up_ptr, GU, S_GU, T_GU, H, counts_ptr, 1, BARRIERS, PREFETCH, MAX_POLLS, BLOCK_N, BLOCK_K)
    _phase(x2_ptr, gate_up_ptr, gate_up_parts, M, GU, H, S_GU, T_GU, H, 1, H, BLOCK_M, BLOCK_N, BLOCK_K)
    _between(down_ptr, H, S_D, T_D, I, counts_ptr, 2, BARRIERS, PREFETCH, MAX_POLLS, BLOCK_N, BLOCK_K)
    _phase(act_ptr, down_ptr, down_parts, M, H, I, S_D, T_D, I, 1, I, BLOCK_M, BLOCK_N, BLOCK_K)


class Persistent:
    """One layer's four products per launch, into workspaces shaped as matmul_partials' sums."""

    def __init__(self, weights: list[dict], inputs: dict, programs: int, barriers: bool, prefetch: bool):
        self.weights, self.inputs, self.programs = weights, inputs, programs
        self.barriers, self.prefetch = barriers, prefetch
        w, m = weights[0], inputs["x"].shape[0]
        self.segments = {name: k_segments(t.shape[0], t.shape[1], t.dtype) for name, t in w.items()}
        self.parts = {name: torch.empty((self.segments[name][0], m, t.shape[1]), dtype=torch.float32, device="cuda")
                      for name, t in w.items()}
        self.counts = torch.zeros(3, dtype=torch.int32, device="cuda")

    def __call__(self) -> None:
        x, attn, x2, act = (self.inputs[k] for k in ("x", "attn", "x2", "act"))
        seg = [v for name in ("qkv", "o", "gate_up", "down") for v in self.segments[name]]
        for w in self.weights:
            self.launch = _layer_kernel[(self.programs,)](
                x, w["qkv"], attn, w["o"], x2, w["gate_up"], act, w["down"],
                self.parts["qkv"], self.parts["o"], self.parts["gate_up"], self.parts["down"], self.counts,
                x.shape[0], w["qkv"].shape[0], w["qkv"].shape[1], w["o"].shape[0], w["gate_up"].shape[1],
                w["down"].shape[0], *seg,
                BARRIERS=self.barriers, PREFETCH=self.prefetch, MAX_POLLS=_MAX_POLLS,
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K[torch.bfloat16],
                num_warps=WARPS, num_stages=STAGES)


class Streamed:
    """The same products by kernels_stream_layer.cu: weights streamed through a ring of `stages`
    shared-memory stages by a producer warp that does not stop at the grid barriers."""

    _library = None

    def __init__(self, persistent: Persistent, stages: int, block_n: int, flags: int):
        self.p, self.stages, self.block_n, self.flags = persistent, stages, block_n, flags
        if Streamed._library is None:
            so = Path(tempfile.mkdtemp()) / "stream_layer.so"
            subprocess.run(["nvcc", "-O3", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-o", str(so),
                            str(Path(__file__).with_name("kernels_stream_layer.cu"))], check=True)
            Streamed._library = ctypes.CDLL(str(so))
        names = ("qkv", "o", "gate_up", "down")
        inputs = [persistent.inputs[k] for k in ("x", "attn", "x2", "act")]
        self.args = []
        for w in persistent.weights:
            # The kernel reads each weight as the [N, K] nn.Linear tensor the operand transposes.
            a = (ctypes.c_uint64 * 4)(*(t.data_ptr() for t in inputs))
            b = (ctypes.c_uint64 * 4)(*(w[n].data_ptr() for n in names))
            parts = (ctypes.c_uint64 * 4)(*(persistent.parts[n].data_ptr() for n in names))
            shape = (ctypes.c_int * 16)(*(v for n in names for v in (w[n].shape[1], w[n].shape[0],
                                                                      *persistent.segments[n])))
            self.args.append((a, b, parts, shape))

    def __call__(self) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        counts = ctypes.c_void_p(self.p.counts.data_ptr())
        for a, b, parts, shape in self.args:
            err = Streamed._library.stream_layer_launch(a, b, parts, shape, counts, self.p.programs, self.stages,
                                                        self.block_n, self.flags, ctypes.c_uint64(stream))
            if err:
                raise RuntimeError(f"stream_layer_launch: error {err}")


def resident_per_sm(compiled) -> int:
    """Programs of a compiled kernel that fit on one SM at once (registers, shared memory), at most 2."""
    props = torch.cuda.get_device_properties(0)
    regs = compiled.n_regs * 32 * WARPS
    smem = max(compiled.metadata.shared, 1)
    return max(1, min(2, props.regs_per_multiprocessor // max(regs, 1),
                      props.shared_memory_per_multiprocessor // smem))


def launches(weights: list[dict], inputs: dict) -> list:
    outs = []
    for w in weights:
        outs += [kernels.matmul_partials(inputs["x"], w["qkv"]), kernels.matmul_partials(inputs["attn"], w["o"]),
                 kernels.matmul_partials(inputs["x2"], w["gate_up"]),
                 kernels.matmul_partials(inputs["act"], w["down"])]
    return outs


def same_bits(weights: list[dict], inputs: dict, persistent: Persistent, run=None) -> bool:
    """The last layer's sums against matmul_partials' (a run of all layers leaves the last layer's in
    the persistent run's workspaces; `run` is that run, persistent itself by default)."""
    persistent.counts.zero_()
    for t in persistent.parts.values():
        t.fill_(float("nan"))
    (run or persistent)()
    torch.cuda.synchronize()
    want = launches(weights[-1:], inputs)
    # A one-segment product comes back summed and rounded (the pointer kernel), as a Tensor.
    return all(torch.equal(p.sums, got) if isinstance(p, Partials) else torch.equal(p, got[0].to(p.dtype))
               for p, got in zip(want, (persistent.parts[n] for n in ("qkv", "o", "gate_up", "down"))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    torch.manual_seed(0)
    sms = sm_count(torch.device("cuda"))
    rows = []
    for shape in args.shapes.split(","):
        weights = layers(shape)[0]
        hidden, _, o_k, inter, count = SHAPES[shape]
        inputs = {k: torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
                  for k, n in (("x", hidden), ("attn", o_k), ("x2", hidden), ("act", inter))}
        probe = Persistent(weights[:1], inputs, sms, True, True)
        probe()
        per_sm = resident_per_sm(probe.launch)
        us = {"launches": gpu_us(lambda: launches(weights, inputs)) / count}
        bits = {"launches": True}
        variants = [("persistent", sms, True, False), ("persistent, prefetch", sms, True, True),
                    ("persistent, no barriers", sms, False, False)]
        if per_sm > 1:
            variants[2:2] = [(f"persistent x{per_sm}", sms * per_sm, True, False),
                             (f"persistent x{per_sm}, prefetch", sms * per_sm, True, True)]
        for name, programs, barriers, prefetch in variants:
            run = Persistent(weights, inputs, programs, barriers, prefetch)
            bits[name] = same_bits(weights, inputs, run)
            us[name] = gpu_us(run) / count
        for stages, block_n, flags in STREAMED:
            name = f"streamed (CUDA), {stages} stages, {block_n} columns" + "".join(
                f", {what}" for bit, what in ((1, "no barriers"), (2, "no math")) if flags & bit)
            run = Persistent(weights, inputs, sms, True, False)
            streamed = Streamed(run, stages, block_n, flags)
            bits[name] = same_bits(weights, inputs, run, streamed) if not flags & 2 else "-"
            us[name] = gpu_us(streamed) / count
        for name in us:
            rows.append({"shape": shape, "variant": name, "us a layer": round(us[name], 2),
                         "/ launches": round(us[name] / us["launches"], 3), "same bits": bits[name]})
            print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    (out / "kernels_persistent_layer.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    md = (f"`python3 bench/kernels_persistent_layer.py` ({gpu}, Triton {triton.__version__}; GPU us a layer "
          f"of a model's four decode matmuls at one row, from CUDA-graph replays of all its layers)\n\n"
          f"{markdown_table(rows)}\n")
    (out / "kernels_persistent_layer.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
