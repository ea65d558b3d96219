"""Static cost of the decode attention kernel on sm_90, compiled without a GPU: registers,
shared memory, and each KV-tile loop's length and leading opcodes, for this tree's kernel and,
with --old-tree, an old tree's beside it (as bench/kernels_attention_ab.py times them on a
GPU). Specialized as the engine launches it at the 0.6B and 8B shapes' decode of 256 sequences
(head_dim 128, pages of 16, the ints divisible by 16 marked so). Counts, not timings: they show where a tile's
instructions go before a GPU is spent on timing it.

    python3 bench/kernels_attention_sass.py [--old-tree .old] [--out bench/results]
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kernels_attention_ab import load_old  # noqa: E402
from bench.kernels_sass import compile_sm90, disassemble, loops, resources  # noqa: E402
from bench.md_table import markdown_table  # noqa: E402
from kernels import attention_triton  # noqa: E402

TYPES = {"part_o_ptr": "*fp32", "part_ml_ptr": "*fp32", "block_tables_ptr": "*i32", "cu_q_ptr": "*i32",
         "kv_lens_ptr": "*i32", "cu_tiles_ptr": "*i32", "scale_log2": "fp32"}
# What the launcher sees divisible by 16 at those shapes (every pointer, too).
DIVISIBLE = re.compile(r"stride_.*|S")
SHAPES = {"0.6B (G 2)": 2, "8B (G 4)": 4}
TOP_OPCODES = 6


def compile_decode(module, G: int, split: bool):
    """The decode kernel (one query a sequence) as the wrapper launches it, on the split path or not."""
    kernel = module._attention_kernel
    block_m, warps = module.CONFIGS[0][1:]
    constexprs = {"D": 128, "BLOCK_D": 128, "G": G, "PAGE": 16, "BLOCK_M": block_m, "BLOCK_N": module.BLOCK_N,
                  "BAND": module.BAND_TILES, "CHUNK": module.CHUNK_TILES, "WIDE_FROM": module.WIDE_FROM,
                  "WIDE": module.WIDE_TILES, "SPLIT": split, "DECODE": True, "PDL": True}
    if not split:  # the fold-in-program path passes zeros for the split path's arguments
        constexprs.update(tiles_per_program=0, chunks_per_program=0, tile_programs=0, stride_pt=0, stride_ph=0,
                          stride_ps=0)
    names = inspect.signature(kernel.fn).parameters
    return compile_sm90(kernel, {n: v for n, v in constexprs.items() if n in names},
                        {"num_warps": warps, "num_stages": module.DECODE_STAGES},
                        lambda n: TYPES.get(n, "*bf16" if n.endswith("_ptr") else "i32"), DIVISIBLE.fullmatch)


def row(tree: str, module, shape: str, G: int, split: bool) -> dict:
    compiled = compile_decode(module, G, split)
    sass, usage = disassemble(compiled.asm["cubin"])
    bodies = []
    for _, _, ops in loops(sass):
        top = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(TOP_OPCODES))
        bodies.append(f"{len(ops)} ({top})")
    regs = resources(usage)
    return {"tree": tree, "shape": shape, "path": "split" if split else "fold in program",
            "registers": regs["registers"], "stack B": regs["stack_bytes"], "shared B": compiled.metadata.shared,
            "loops: instructions (leading opcodes)": "; ".join(bodies) or "-"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    trees = {"new": attention_triton, **({"old": load_old(args.old_tree)} if args.old_tree else {})}
    rows = [row(tree, module, shape, G, split) for shape, G in SHAPES.items() for split in (False, True)
            for tree, module in sorted(trees.items(), reverse=True)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_attention_sass.json").write_text(
        json.dumps({"triton": triton.__version__, "old_tree": str(args.old_tree), "rows": rows}, indent=1))
    command = "python3 bench/kernels_attention_sass.py" + (f" --old-tree {args.old_tree}" if args.old_tree else "")
    text = (f"`{command}` (Triton {triton.__version__}, ptxas from its wheel, sm_90, no GPU). Decode, one query a "
            f"sequence; each loop's body once, in program order: the fold path's one-tile splits unmasked, then "
            f"masked, then its chunk splits, whose loop holds the two after it (a chunk's walk, unmasked and masked).\n\n{markdown_table(rows)}\n")
    (out / "kernels_attention_sass.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
