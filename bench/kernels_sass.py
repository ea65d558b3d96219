"""Static cost of the sampling kernels on Hopper, measured without a GPU.

Compiles each kernel for sm_90 with the ptxas that ships with Triton (no device
needed), as the launcher would specialize it at V = 152064 (pointers, row stride
and V divisible by 16), disassembles it and counts registers, instructions,
barriers, special-function (MUFU) and the multiply-add instructions that carry
the logs (FFMA) and Philox (IMAD). For the longest loop it also gives the body's
length and the spans that forward branches inside it can skip (in the radix select:
the mass sums, skipped for top-k-only rows). Counts are not timings: they show
where a kernel's work goes, and that it still compiles for the GPU, on a machine
without one; speed is measured by bench/kernels_sampling.py on a GPU.

    python3 bench/kernels_sass.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import sampling_candidates as sc  # noqa: E402
from kernels import sampling_filter as sf  # noqa: E402
from kernels import sampling_triton as st  # noqa: E402
from kernels.toolchain import FP_FUSION  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
NV_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
ARG_TYPES = {  # name -> Triton type, for every argument name the sampling kernels use
    "stride": "i32", "V": "i32", "C": "i32", "P": "i32", "B": "i32", "r": "i32", "seed_ptr": "*i64",
    "step_ptr": "*i64", "temp_ptr": "*fp32", "top_k_ptr": "*i32", "top_p_ptr": "*fp32", "state_i_ptr": "*i32",
    "state_f_ptr": "*fp32", "part_ptr": "*i32", "count_ptr": "*i32", "mass_ptr": "*fp32", "bound_ptr": "*i32",
    "out_ptr": "*i64", "best_ptr": "*fp32", "where_ptr": "*i32", "m_ptr": "*fp32", "z_ptr": "*fp32",
    "settled_ptr": "*i32", "hist_ptr": "*i32", "list_ptr": "*i64", "size_ptr": "*i32",
    "last_ptr": "*i32", "next_ptr": "*i32", "work_ptr": "*i32", "done_ptr": "*i32", "W": "i32", "tile_ptr": "*i32",
}
_BINS = 1 << sf._BITS
_FILTER = {"BLOCK": st._BLOCK, "CHUNKS": st._CHUNKS, "CP": 64, "PP": 32, "BINS": _BINS, "BITS": sf._BITS, "ROWS": 1}
_LIST = {"CP": 64, "STEP": sc._STEP, "BUCKETS": sc._BUCKETS}  # what every candidate-list kernel but the settle takes
# (name, kernel, constexprs, launch options or a function of the dtype giving them), sizes as the
# wrappers pick them at V = 152064
KERNELS = (
    ("sample pass 1", st._sample_partial_kernel, {"BLOCK": st._BLOCK, "EARLY": True},
     lambda dtype: {"num_warps": st._WARPS, "enable_fp_fusion": False,
                    "maxnreg": st._pass1_registers(2 if dtype == "bf16" else 4)}),
    ("sample pick (filtered batch)", st._sample_pick_kernel, {"BLOCK": st._BLOCK, "CP": 64, "FILTERED": True,
                                                             "PDL": False},
     {"num_warps": st._WARPS, "enable_fp_fusion": False}),
    ("top-k/top-p histogram", sc._histogram_kernel,
     {**_LIST, "BLOCK": st._BLOCK, "CHUNKS": st._CHUNKS, "SUB": sc._HISTOGRAM_TILE, "TILE": sc._TILE},
     {"num_warps": sc._WARPS}),
    ("top-k/top-p choose", sc._choose_kernel, {**_LIST, "PP": 32, "CAP": sc._CAP}, {"num_warps": sc._WARPS}),
    ("top-k/top-p gather", sc._gather_kernel, {**_LIST, "CAP": sc._CAP, "PART": st._CHUNKS * st._BLOCK,
                                               "TILE": sc._TILE, "ROUND": sc._ROUND}, {"num_warps": sc._WARPS}),
    ("top-k/top-p settle", sc._settle_kernel, {"CP": 64, "CAP": sc._CAP, "SMALL": sc._SMALL},
     {"num_warps": sc._WARPS, "enable_fp_fusion": False}),
    ("top-k/top-p radix select", sf._select_kernel, {**_FILTER, "SUB": sf._SUB, "ROUNDS": 32 // sf._BITS},
     {"num_warps": sf._WARPS, "enable_fp_fusion": False}),
    ("argmax partial", st._argmax_partial_kernel, {"BLOCK": st._BLOCK, "CHUNKS": st._CHUNKS}, {"num_warps": st._WARPS}),
    ("logsumexp partial", st._lse_partial_kernel, {"BLOCK": st._BLOCK, "CHUNKS": st._CHUNKS}, {"num_warps": st._WARPS}),
)
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\s+`\((\.L_x_\d+)\)")


def _parse(sass: str) -> tuple[list[str], dict[str, int], list[tuple[int, str]]]:
    """(opcodes in order, each label's index, (index, target label) of each branch)."""
    ops, labels, branches = [], {}, []
    for line in sass.splitlines():
        if label := _LABEL.match(line):
            labels[label.group(1)] = len(ops)
        elif op := _INSTRUCTION.match(line):
            ops.append(op.group(1))
            if branch := _BRANCH.search(line):
                branches.append((len(ops) - 1, branch.group(1)))
    return ops, labels, branches


def loops(sass: str) -> list[tuple[int, int, list[str]]]:
    """(first, last index, opcodes) of every loop body, in program order."""
    ops, labels, branches = _parse(sass)
    # (a branch to itself is the trap after EXIT, not a loop)
    spans = sorted({(labels[t], at) for at, t in branches if t in labels and labels[t] < at})
    return [(head, tail, ops[head:tail + 1]) for head, tail in spans]


def loop_spans(sass: str) -> tuple[int, list[int]]:
    """(instructions in the longest loop body, instructions skipped by each forward branch inside it)."""
    _, labels, branches = _parse(sass)
    bodies = loops(sass)
    if not bodies:
        return 0, []
    head, tail, _ = max(bodies, key=lambda loop: loop[1] - loop[0])
    skips = [labels[t] - at - 1 for at, t in branches if head <= at < tail and at < labels.get(t, -1) <= tail]
    return tail - head + 1, [s for s in skips if s > 0]


def compile_sm90(kernel, constexprs: dict, options: dict, type_of, divisible):
    """The kernel compiled for sm_90 as a launch specializes it: type_of(name) gives each argument's
    Triton type, and the pointers and the ints divisible(name) names are marked divisible by 16."""
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else type_of(n) for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n].startswith("*") or (signature[n] == "i32" and divisible(n))}
    source = ASTSource(kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    # FMA contraction as the launches name it where a kernel leaves it to the toolchain
    return triton.compile(source, target=TARGET, options={"enable_fp_fusion": FP_FUSION, **options})


def _sampling_cubin(kernel, dtype: str, constexprs: dict, options: dict) -> bytes:
    # What the launcher's specialization gives at V = 152064: stride and V divisible by 16.
    return compile_sm90(kernel, constexprs, options, lambda n: ARG_TYPES.get(n, f"*{dtype}"),
                        lambda n: n in ("stride", "V")).asm["cubin"]


def disassemble(cubin: bytes) -> tuple[str, str]:
    """(SASS, resource usage) of a cubin, by the tools that ship with Triton."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([NV_BIN / "nvdisasm", "-c", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([NV_BIN / "cuobjdump", "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    return sass, usage


def resources(usage: str) -> dict:
    """Registers and stack bytes a thread, from cuobjdump's resource usage."""
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "stack_bytes": int(re.search(r"STACK:(\d+)", usage).group(1))}


def count(cubin: bytes) -> dict:
    sass, usage = disassemble(cubin)
    ops = _parse(sass)[0]
    kinds = collections.Counter(ops)
    body, skips = loop_spans(sass)
    return {
        **resources(usage),
        "instructions": len(ops),
        "loop_body": body,
        "loop_skippable": skips,
        "barriers": kinds["BAR"],
        "mufu": kinds["MUFU"],
        "ffma": kinds["FFMA"],
        "imad": kinds["IMAD"],
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Sampling kernels: static cost on sm_90 (compiled without a GPU)",
        "",
        f"Triton {triton.__version__}, ptxas from its wheel; specialized as at V = 152064. Counts, not timings.",
        "",
        "| kernel | dtype | registers | stack B | SASS instructions | longest loop body | of it skippable | BAR | MUFU | FFMA | IMAD |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['registers']} | {r['stack_bytes']} | {r['instructions']} "
                     f"| {r['loop_body'] or '-'} | {', '.join(map(str, r['loop_skippable'])) or '-'} | {r['barriers']} | {r['mufu']} | {r['ffma']} | {r['imad']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    rows = []
    for name, kernel, constexprs, options in KERNELS:
        for dtype in ("bf16", "fp32"):
            opts = options(dtype) if callable(options) else options
            rows.append({"kernel": name, "dtype": dtype, **count(_sampling_cubin(kernel, dtype, constexprs, opts))})
            print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_sass.json").write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))
    md = markdown(rows)
    (out / "kernels_sass.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
