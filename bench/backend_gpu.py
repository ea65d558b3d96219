"""One GPU run for the whitebox backend: determinism and throughput, invariant vs standard.

For each model shape: write a random-weight checkpoint on the GPU (no hub), start
`detgate backend` in each mode, run the determinism harness (backend_determinism.py)
and the throughput sweep (backend_throughput.py) against it, then time transformers'
generate on the same checkpoint and compare its next-token logprobs with the backend's.
Writes backend_gpu.json / .md and backend_throughput.png to --out; prints a short table last.

    python bench/backend_gpu.py --out bench/results --shapes qwen3-0.6b -n 1000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from backend_determinism import KINDS, Client, run_all  # noqa: E402
from backend_server import backend  # noqa: E402
from backend_throughput import backend_sweep, transformers_sweep  # noqa: E402
from local_backend.random_checkpoint import SHAPES, numbered_tokenizer, write_checkpoint  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MODES = ("invariant", "standard")


def make_checkpoint(root: Path, name: str, layers: int | None) -> tuple[Path, dict]:
    shape = dict(SHAPES[name])
    if layers:
        shape["num_layers"] = layers
    tok = numbered_tokenizer(shape["vocab_size"], SPECIALS)
    path = write_checkpoint(root / name, shape, tok, device="cuda", shards=4 if shape["hidden_size"] > 2048 else 1)
    torch.cuda.empty_cache()   # hand the generator's memory back before the server starts
    return path, shape


async def next_token_logprobs(url: str, vocab: int, prompts: list[list[int]]) -> list[dict]:
    async with Client(url, vocab) as client:
        out = []
        for p in prompts:
            data = await client.post("/v1/completions", {"prompt": p, "max_tokens": 1, "logprobs": 5, "temperature": 0})
            top = data["choices"][0]["logprobs"]["top_logprobs"][0]
            out.append({int(t[1:]): lp for t, lp in top.items() if t.startswith("t")})
        return out


def transformers_logprobs(path: Path, prompts: list[list[int]]) -> list[dict]:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            lp = model(torch.tensor([p], device="cuda")).logits[0, -1].float().log_softmax(-1)
            values, ids = lp.topk(5)
            out.append(dict(zip(ids.tolist(), values.tolist())))
    del model
    torch.cuda.empty_cache()
    return out


def engine_stats(url: str) -> dict:
    """What the engine did, from its own /metrics: how varied the batches were, cache use."""
    import urllib.request
    with urllib.request.urlopen(url + "/metrics") as r:
        lines = r.read().decode().splitlines()
    values = {}
    for line in lines:
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    steps = values.get("detgate_backend_batch_size_count", 0)
    buckets = {name.split('le="')[1].rstrip('"}'): v for name, v in values.items()
               if name.startswith("detgate_backend_batch_size_bucket")}
    return {"engine_steps": steps,
            "mean_batch": round(values.get("detgate_backend_batch_size_sum", 0) / max(steps, 1), 1),
            "batch_size_cumulative": buckets,
            "prefix_cache_hit_blocks": values.get("detgate_backend_prefix_cache_hits_total"),
            "prefix_cache_query_blocks": values.get("detgate_backend_prefix_cache_queries_total"),
            "generated_tokens": values.get("detgate_backend_generation_tokens_total")}


def compare_logprobs(ours: list[dict], theirs: list[dict]) -> dict:
    top1 = sum(max(a, key=a.get) == max(b, key=b.get) for a, b in zip(ours, theirs))
    diffs = [abs(a[t] - b[t]) for a, b in zip(ours, theirs) for t in a if t in b]
    return {"prompts": len(ours), "top1_agree": top1, "max_abs_logprob_diff": round(max(diffs), 4) if diffs else None}


def run_shape(name: str, args, out: Path, deadline: float) -> dict:
    result: dict = {"shape": name}
    t0 = time.perf_counter()
    path, shape = make_checkpoint(Path(args.workdir), name, args.layers.get(name))
    vocab = shape["vocab_size"]
    result["config"] = dict(shape)
    result["checkpoint_seconds"] = round(time.perf_counter() - t0, 1)
    import random
    rng = random.Random(3)
    probe = [[rng.randrange(vocab - 8) for _ in range(rng.randint(16, 200))] for _ in range(4)]
    for mode in args.modes:
        if time.monotonic() > deadline:
            result[mode] = {"skipped": "out of time"}
            continue
        t0 = time.perf_counter()
        log = out / f"server_{name}_{mode}.log"
        entry: dict = {}
        try:
            with backend(path, args.port, log, "--mode", mode, "--max-model-len", "1024",
                         "--kv-blocks", str(args.kv_blocks), *args.server_args) as url:
                entry["startup_seconds"] = round(time.perf_counter() - t0, 1)
                entry["next_token"] = asyncio.run(next_token_logprobs(url, vocab, probe))
                budget = min(args.budget_s, max(10.0, deadline - time.monotonic() - 60))
                entry["determinism"] = asyncio.run(run_all(url, vocab, args.n, budget, args.concurrency, args.replays))
                entry["engine"] = engine_stats(url)
                if name in args.throughput:
                    entry["throughput"] = asyncio.run(backend_sweep(url, vocab))
        except Exception:
            entry["error"] = traceback.format_exc()
            print(entry["error"], flush=True)
        result[mode] = entry
        shown = {k: v for k, v in entry.items() if k not in ("next_token", "engine")}
        print(f"[{name} {mode}] {json.dumps(shown)}", flush=True)
    if name in args.transformers and time.monotonic() < deadline:
        try:
            result["transformers"] = transformers_sweep(str(path), vocab)
            theirs = transformers_logprobs(path, probe)
            for mode in args.modes:
                if "next_token" in result.get(mode, {}):
                    result[mode]["vs_transformers"] = compare_logprobs(result[mode]["next_token"], theirs)
        except Exception:
            result["transformers_error"] = traceback.format_exc()
            print(result["transformers_error"], flush=True)
    return result


def tables(results: list[dict]) -> str:
    lines = ["## Determinism: unique outputs of one request (1 = bit-identical every time)", "",
             "| model | scenario | request | N | invariant | standard |", "|---|---|---|---|---|---|"]
    for r in results:
        inv, std = r.get("invariant", {}).get("determinism", {}), r.get("standard", {}).get("determinism", {})
        for scenario in ("load", "cache", "multi_turn"):
            for kind in KINDS:
                a, b = inv.get(scenario, {}).get(kind, {}), std.get(scenario, {}).get(kind, {})
                lines.append(f"| {r['shape']} | {scenario} | {kind} | {a.get('n', '-')}/{b.get('n', '-')} "
                             f"| {a.get('unique', '-')} | {b.get('unique', '-')} |")
    lines += ["", "| model | mode | engine steps | mean sequences per step | prefix-cache hits / lookups (blocks) |",
              "|---|---|---|---|---|"]
    for r in results:
        for mode in MODES:
            e = r.get(mode, {}).get("engine")
            if e:
                lines.append(f"| {r['shape']} | {mode} | {e['engine_steps']:.0f} | {e['mean_batch']} "
                             f"| {e['prefix_cache_hit_blocks']:.0f} / {e['prefix_cache_query_blocks']:.0f} |")
    for r in results:
        inv, std = r.get("invariant", {}).get("throughput"), r.get("standard", {}).get("throughput")
        if not inv:
            continue
        hf = {row["batch"]: row["tok_per_s"] for row in r.get("transformers", [])}
        lines += ["", f"## Throughput, {r['shape']} (generated tokens/s; 128-token prompts, 128 new tokens)", "",
                  "| concurrent | invariant | standard | invariant/standard | transformers | invariant/transformers |",
                  "|---|---|---|---|---|---|"]
        std_by = {row["concurrency"]: row["tok_per_s"] for row in std or []}
        for row in inv:
            c, v = row["concurrency"], row["tok_per_s"]
            s = std_by.get(c)
            h = hf.get(c)
            lines.append(f"| {c} | {v} | {s or '-'} | {f'{v / s:.2f}' if s else '-'} | {h or '-'} "
                         f"| {f'{v / h:.1f}x' if h else '-'} |")
    for r in results:
        for mode in MODES:
            cmp = r.get(mode, {}).get("vs_transformers")
            if cmp:
                lines.append(f"\n{r['shape']} {mode}: next-token top-1 agrees with transformers on "
                             f"{cmp['top1_agree']}/{cmp['prompts']} prompts; max |logprob diff| {cmp['max_abs_logprob_diff']}")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        for mode, style in (("invariant", "-o"), ("standard", "--s")):
            rows = r.get(mode, {}).get("throughput")
            if rows:
                ax.plot([x["concurrency"] for x in rows], [x["tok_per_s"] for x in rows], style,
                        label=f"{r['shape']} {mode}")
        hf = r.get("transformers")
        if hf:
            ax.plot([x["batch"] for x in hf], [x["tok_per_s"] for x in hf], ":^", label=f"{r['shape']} transformers")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens / s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--workdir", default="/tmp/detgate_bench")
    p.add_argument("--shapes", default="qwen3-0.6b", help="comma-separated names from random_checkpoint.SHAPES")
    p.add_argument("--layers", default="", help="e.g. llama3-8b=8 to cut a shape's layer count")
    p.add_argument("--throughput", default="qwen3-0.6b", help="shapes that get the throughput sweep")
    p.add_argument("--modes", default="invariant,standard")
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--budget-s", type=float, default=60, help="time per mode for the N-copies scenario")
    p.add_argument("--total-s", type=float, default=270, help="skip what would start after this")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--replays", type=int, default=6)
    p.add_argument("--kv-blocks", type=int, default=8192)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--transformers", default="qwen3-0.6b", help="shapes also timed through transformers")
    p.add_argument("--server-args", default="", help="extra flags for detgate backend")
    args = p.parse_args()
    args.modes = args.modes.split(",")
    args.throughput = set(args.throughput.split(",")) if args.throughput else set()
    args.transformers = set(args.transformers.split(",")) if args.transformers else set()
    args.layers = {k: int(v) for k, v in (kv.split("=") for kv in args.layers.split(",") if kv)}
    args.server_args = args.server_args.split()
    deadline = time.monotonic() + args.total_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "n_requested": args.n, "background_concurrency": args.concurrency}
    results = [run_shape(name, args, out, deadline) for name in args.shapes.split(",")]
    (out / "backend_gpu.json").write_text(json.dumps({"env": env, "results": results}, indent=2))
    text = tables(results)
    (out / "backend_gpu.md").write_text(f"# Whitebox backend on {env['gpu']}\n\n{text}\n")
    plot(results, out / "backend_throughput.png")
    print(text)


if __name__ == "__main__":
    main()
