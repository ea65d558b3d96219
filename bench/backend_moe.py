"""One GPU run for Qwen3-MoE (kernels/moe.py): correct and invariant at the real shape, the experts'
speed beside their floor and the vendor path, then the engine at 1, 32 and 256 requests.

1. tests/kernels/test_moe.py on the GPU (Qwen3-30B-A3B's experts: H 2048, I 768, 128 experts,
   top 8): against the fp64 reference, a token's bits alone and in batches of 1..4096 whose
   other tokens share its experts, every tile config alike.
2. One MoE layer's experts (route + grouped SwiGLU + down + combine) at 1, 32 and 256 tokens,
   invariant against --mode standard's torch._grouped_mm, each a CUDA graph's replay, beside the
   floor: the distinct experts the tokens chose, read once, over the copy bandwidth. Tile
   variants of the invariant kernel are timed too (their bits are checked equal).
3. The engine (bench/backend_gpu.py's sweep) on a random qwen3-30b-a3b checkpoint with its 48
   layers cut to --layers (disk, load and capture time), invariant and standard; optionally the
   determinism harness.

    python bench/backend_moe.py --out bench/results --layers 8
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import backend_gpu  # noqa: E402
from kernels import matmul, moe  # noqa: E402
from kernels.mode import mode  # noqa: E402
from kernels_sampling import copy_gbps  # noqa: E402
from local_backend.random_checkpoint import SHAPES  # noqa: E402

SHAPE = "qwen3-30b-a3b"
TOKENS = (1, 32, 256)
# (layout, (BLOCK_M, BLOCK_N, warps, stages)) tried beside the dispatch's choice
VARIANTS = {
    "slot": [(16, 64, 4, 4), (16, 64, 8, 6), (16, 128, 8, 4), (16, 32, 8, 6), (16, 64, 4, 6)],
    "sorted": [(16, 64, 4, 4), (16, 128, 4, 4), (16, 128, 8, 4), (64, 128, 4, 3)],
}


def kernel_tests() -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/test_moe.py"],
                          cwd=ROOT, capture_output=True, text=True)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    if proc.returncode:
        print(proc.stdout[-6000:], proc.stderr[-3000:], flush=True)
    return {"returncode": proc.returncode, "summary": tail, "seconds": round(time.perf_counter() - t0, 1)}


def graph_us(fn, reps: int = 30) -> float:
    """Median time of one replay of a CUDA graph of fn(), us."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def experts_bench(bandwidth: float) -> list[dict]:
    s = SHAPES[SHAPE]
    h, e, k, i = s["hidden_size"], s["moe"]["num_experts"], s["moe"]["num_experts_per_tok"], s["moe"]["moe_intermediate_size"]
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    gate_up, down = randn(e, 2 * i, h, scale=h ** -0.5), randn(e, h, i, scale=i ** -0.5)
    router = randn(h, e, scale=h ** -0.5)
    rows = []
    for t in TOKENS:
        x = randn(t, h)
        weights, ids = moe.route(matmul(x, router), k, True)
        chosen = ids.unique().numel()
        floor_us = chosen * 3 * h * i * 2 / bandwidth * 1e6
        row = {"tokens": t, "experts_chosen": chosen, "floor_us": round(floor_us, 1)}

        def layer():
            w, d = moe.route(matmul(x, router), k, True)
            return moe.experts(x, w, d, gate_up, down)

        row["invariant_layer_us"] = round(graph_us(layer), 1)
        row["invariant_experts_us"] = round(graph_us(lambda: moe.experts(x, weights, ids, gate_up, down)), 1)
        with mode("standard"):
            row["standard_layer_us"] = round(graph_us(layer), 1)
            row["standard_experts_us"] = round(graph_us(lambda: moe.experts(x, weights, ids, gate_up, down)), 1)
            standard = moe.experts(x, weights, ids, gate_up, down)
        ours = moe.experts(x, weights, ids, gate_up, down)
        row["standard_vs_invariant_rel"] = round(((standard.float() - ours.float()).norm() / ours.float().norm()).item(), 5)
        layout = moe._config(t * k, e, x.device)[0]
        variants = {}
        for tile in VARIANTS[layout]:
            out = moe._experts_triton(x, weights, ids, gate_up, down, (layout, tile))
            variants[str(tile)] = {"us": round(graph_us(lambda: moe._experts_triton(x, weights, ids, gate_up, down,
                                                                                   (layout, tile))), 1),
                                   "same_bits": bool(torch.equal(out, ours))}
        row["layout"], row["variants"] = layout, variants
        row["of_floor"] = round(floor_us / row["invariant_experts_us"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def engine_args(a) -> argparse.Namespace:
    return argparse.Namespace(
        workdir=a.workdir, logs=None, layers={SHAPE: a.layers}, levels={SHAPE: list(TOKENS)}, modes=["invariant", "standard"],
        max_model_len=a.max_model_len, long_prompt=0, scoring={SHAPE} if a.scoring else set(), scoring_n=100,
        determinism={SHAPE} if a.determinism else set(), determinism_modes={"invariant"}, n=a.n, budget_s=a.budget_s,
        concurrency=32, replays=4, kv_blocks=a.kv_blocks, port=8765, transformers=set(), server_args=[])


def experts_table(rows: list[dict]) -> str:
    lines = ["| tokens | experts chosen | floor us | invariant experts us | of floor | standard experts us "
             "| invariant / standard | layer (router + route + experts) invariant / standard us | layout | fastest variant |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = min(r["variants"].items(), key=lambda kv: kv[1]["us"])
        lines.append(f"| {r['tokens']} | {r['experts_chosen']} | {r['floor_us']} | {r['invariant_experts_us']} | "
                     f"{r['of_floor']} | {r['standard_experts_us']} | "
                     f"{r['invariant_experts_us'] / r['standard_experts_us']:.2f} | {r['invariant_layer_us']} / "
                     f"{r['standard_layer_us']} | {r['layout']} | {best[0]} {best[1]['us']} us |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--workdir", default="/tmp/detgate_moe")
    p.add_argument("--layers", type=int, default=8, help="of qwen3-30b-a3b's 48")
    p.add_argument("--parts", default="tests,experts,engine")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-blocks", type=int, default=8192)
    p.add_argument("--determinism", action="store_true")
    p.add_argument("--scoring", action="store_true")
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--budget-s", type=float, default=60)
    p.add_argument("--total-s", type=float, default=500)
    a = p.parse_args()
    parts = set(a.parts.split(","))
    deadline = time.monotonic() + a.total_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_gbps() * 1e9
    torch.cuda.empty_cache()
    result = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "copy_bandwidth_gbs": round(bandwidth / 1e9, 1), "layers": a.layers}}
    if "tests" in parts:
        result["tests"] = kernel_tests()
        print("tests:", result["tests"], flush=True)
    if "experts" in parts:
        try:
            result["experts"] = experts_bench(bandwidth)
        except Exception:
            result["experts_error"] = traceback.format_exc()
            print(result["experts_error"], flush=True)
        torch.cuda.empty_cache()
    if "engine" in parts:
        result["engine"] = backend_gpu.run_shape(SHAPE, engine_args(a), out, deadline, bandwidth)
    (out / "backend_moe_h200.json").write_text(json.dumps(result, indent=2))
    text = [f"# Qwen3-MoE on {result['env']['gpu']}", "",
            f"Copy bandwidth (read + write): {bandwidth / 1e9:.0f} GB/s; torch {torch.__version__}.", ""]
    if "tests" in result:
        text += [f"GPU kernel tests (tests/kernels/test_moe.py): {result['tests']['summary']}", ""]
    if result.get("experts"):
        text += ["## One MoE layer's experts (30B-A3B shape), CUDA graph replays", "", experts_table(result["experts"]), ""]
    if "engine" in result:
        text += [f"## The engine, qwen3-30b-a3b cut to {a.layers} of 48 layers", "",
                 backend_gpu.tables([result["engine"]], bandwidth), ""]
    (out / "backend_moe_h200.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
