"""One GPU run for the whitebox backend: speed, where the time goes, determinism, and scoring
against sampling, invariant vs standard.

For each model shape: write a random-weight checkpoint on the GPU (no hub), start
`detgate backend` in each mode, and against it run the latency sweep (backend_latency.py:
tokens/s, time to first token and inter-token latency, each engine step's GPU and host
time, a long prompt's first token), set beside the floor (the bytes one decode step must
read: weights and KV, over this GPU's measured copy bandwidth); the scoring-equals-sampling
check (backend_scoring.py); the determinism harness (backend_determinism.py); optionally
transformers' generate on the same checkpoint. Writes backend_gpu.json / .md and
backend_throughput.png to --out; prints a short table last.

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

import backend_latency  # noqa: E402
import backend_scoring  # noqa: E402
from backend_determinism import KINDS, Client, run_all  # noqa: E402
from backend_server import backend, metrics  # noqa: E402
from backend_throughput import transformers_sweep  # noqa: E402
from kernels_sampling import copy_gbps  # noqa: E402
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
    values = metrics(url)
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


def step_bytes(shape: dict, concurrency: int, context: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one decode step reads: every layer's matrices and the LM head, and
    each sequence's K and V over `context` positions (bf16)."""
    h, i, d, layers = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"], shape["num_layers"]
    q, kv = shape["num_heads"] * d, shape["num_kv_heads"] * d
    per_layer = h * (q + 2 * kv) + q * h + 2 * h * i + i * h
    moe = shape.get("moe")
    if moe:
        # Every layer sparse (the shapes here list none dense): the router, and the experts the step's
        # tokens choose, expected distinct under uniform routing (random weights route near so).
        e, k = moe["num_experts"], moe["num_experts_per_tok"]
        active = e * (1 - (1 - k / e) ** concurrency)
        per_layer = h * (q + 2 * kv) + q * h + h * e + active * 3 * h * moe["moe_intermediate_size"]
    weights = round(2 * (layers * per_layer + shape["vocab_size"] * h))
    return weights, 2 * concurrency * context * layers * 2 * kv


def floors(shape: dict, levels: list[dict], bandwidth: float, prompt_len: int = 128, gen_len: int = 128) -> None:
    """Adds the floor to each level: the mean decode step's bytes over the copy bandwidth."""
    for row in levels:
        c = row["concurrency"]
        weights, kv = step_bytes(shape, c, prompt_len + gen_len // 2)
        seconds = (weights + kv) / bandwidth
        row["floor"] = {"weight_mb": round(weights / 1e6), "kv_mb": round(kv / 1e6), "step_us": round(seconds * 1e6, 1),
                        "tok_per_s": round(c / seconds)}
        per_step = row["per_step"]
        row["decode_of_floor"] = round(seconds * 1e6 / per_step["wall_us"], 3) if per_step["steps"] else None


def run_shape(name: str, args, out: Path, deadline: float, bandwidth: float) -> dict:
    result: dict = {"shape": name}
    t0 = time.perf_counter()
    path, shape = make_checkpoint(Path(args.workdir), name, args.layers.get(name))
    vocab = shape["vocab_size"]
    result["config"] = dict(shape)
    result["checkpoint_seconds"] = round(time.perf_counter() - t0, 1)
    import random
    rng = random.Random(3)
    probe = [[rng.randrange(vocab - 8) for _ in range(rng.randint(16, 200))] for _ in range(4)]
    levels = args.levels.get(name, backend_latency.LEVELS)
    for mode in args.modes:
        if time.monotonic() > deadline:
            result[mode] = {"skipped": "out of time"}
            continue
        t0 = time.perf_counter()
        log = Path(args.logs or out) / f"server_{name}_{mode}.log"
        entry: dict = {}
        try:
            with backend(path, args.port, log, "--mode", mode, "--max-model-len", str(args.max_model_len),
                         "--max-batch", str(max(levels)), "--kv-blocks", str(args.kv_blocks), *args.server_args) as url:
                entry["startup_seconds"] = round(time.perf_counter() - t0, 1)
                entry["next_token"] = asyncio.run(next_token_logprobs(url, vocab, probe))
                entry["latency"] = asyncio.run(backend_latency.run(url, vocab, levels, long_prompt=args.long_prompt))
                floors(shape, entry["latency"]["levels"], bandwidth)
                if name in args.scoring:
                    entry["scoring"] = asyncio.run(backend_scoring.run(url, vocab, args.scoring_n, args.concurrency))
                if mode in args.determinism_modes and name in args.determinism:
                    budget = min(args.budget_s, max(10.0, deadline - time.monotonic() - 60))
                    entry["determinism"] = asyncio.run(run_all(url, vocab, args.n, budget, args.concurrency,
                                                               args.replays))
                entry["engine"] = engine_stats(url)
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


def _ms(pair) -> str:
    return " / ".join("-" if x is None else f"{x:g}" for x in pair)


def tables(results: list[dict], bandwidth: float) -> str:
    lines = [f"Copy bandwidth (read + write): {bandwidth / 1e9:.0f} GB/s.", "",
             "## Where a decode step's time goes (per engine step, us; 128-token prompts, 128 new tokens)", "",
             "floor: the weights and the mean step's KV over the copy bandwidth. step wall: from reading the "
             "previous step's tokens to reading this step's (the engine queues the next step before it reads "
             "one). host in step: the step's wall time less its GPU time, the host work the GPU waited for "
             "(scheduling, block tables, staging, launches). hand-off wait: the engine waiting for the HTTP "
             "side to read the previous lot of tokens, mostly while the GPU works on the queued steps. "
             "outside: the engine loop between steps (waiting for requests). Prefill steps are in the "
             "averages.", "",
             "| model | mode | concurrent | tok/s | floor tok/s | of floor | step wall | GPU forward | GPU sampler "
             "| sampler share of GPU | host in step | hand-off wait | host outside | TTFT p50 / p99 ms | ITL p50 / p99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for mode in MODES:
            for row in r.get(mode, {}).get("latency", {}).get("levels", []):
                st, fl = row["per_step"], row["floor"]
                gpu = st["gpu_forward_us"] + st["gpu_sampler_us"]
                share = f"{st['gpu_sampler_us'] / gpu:.1%}" if gpu else "-"
                lines.append(f"| {r['shape']} | {mode} | {row['concurrency']} | {row['tok_per_s']} | {fl['tok_per_s']} "
                             f"| {row['decode_of_floor']} | {st['wall_us']} | {st['gpu_forward_us']} | "
                             f"{st['gpu_sampler_us']} | {share} | {st['host_in_step_us']} | {st['handoff_wait_us']} | {st['host_outside_step_us']} "
                             f"| {_ms(row['ttft_ms'])} | {_ms(row['itl_ms'])} |")
    lines += ["", "| model | long prompt | TTFT invariant ms | TTFT standard ms | invariant / standard |", "|---|---|---|---|---|"]
    for r in results:
        inv, std = (r.get(m, {}).get("latency", {}).get("long_prompt") for m in MODES)
        if inv or std:
            ratio = f"{inv['ttft_ms'] / std['ttft_ms']:.2f}" if inv and std else "-"
            n = (inv or std)["prompt_tokens"]
            lines.append(f"| {r['shape']} | {n} tokens | {inv and inv['ttft_ms']} | {std and std['ttft_ms']} | {ratio} |")
    lines += ["", "## Scoring equals sampling: completion tokens whose rescored logprob differs in any bit", "",
              "| model | mode | completions | tokens | token logprobs compared | differing | completions differing "
              "(echo / prompt_logprobs) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for mode in MODES:
            sc = r.get(mode, {}).get("scoring")
            if sc:
                lines.append(f"| {r['shape']} | {mode} | {sc['completions']} | {sc['tokens']} | {2 * sc['tokens']} | "
                             f"{sc['tokens_differing']} | {sc['completions_differing']} / "
                             f"{sc['completions_differing_prompt_logprobs']} |")
    lines += ["", "## Determinism: unique outputs of one request (1 = bit-identical every time)", "",
              "| model | scenario | request | N (invariant / standard) | invariant | standard |", "|---|---|---|---|---|---|"]
    for r in results:
        inv, std = r.get("invariant", {}).get("determinism", {}), r.get("standard", {}).get("determinism", {})
        if not (inv or std):
            continue
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
            rows = r.get(mode, {}).get("latency", {}).get("levels")
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
    p.add_argument("--logs", help="where the servers' logs go (default: --out)")
    p.add_argument("--shapes", default="qwen3-0.6b", help="comma-separated names from random_checkpoint.SHAPES")
    p.add_argument("--layers", default="", help="e.g. llama3-8b=8 to cut a shape's layer count")
    p.add_argument("--levels", default="llama3-8b=1:32", help="concurrency levels per shape, e.g. qwen3-0.6b=1:32:256")
    p.add_argument("--modes", default="invariant,standard")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--long-prompt", type=int, default=4000, help="time the first token of a prompt this long")
    p.add_argument("--scoring", default="qwen3-0.6b", help="shapes that get the scoring-equals-sampling check")
    p.add_argument("--scoring-n", type=int, default=200)
    p.add_argument("--determinism", default="qwen3-0.6b", help="shapes that get the determinism harness")
    p.add_argument("--determinism-modes", default="invariant")
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--budget-s", type=float, default=60, help="time per mode for the N-copies scenario")
    p.add_argument("--total-s", type=float, default=420, help="skip what would start after this")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--replays", type=int, default=6)
    p.add_argument("--kv-blocks", type=int, default=8192)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--transformers", default="", help="shapes also timed through transformers")
    p.add_argument("--server-args", default="", help="extra flags for detgate backend")
    args = p.parse_args()
    args.modes = args.modes.split(",")
    for name in ("scoring", "determinism", "determinism_modes", "transformers"):
        value = getattr(args, name)
        setattr(args, name, set(value.split(",")) if value else set())
    args.layers = {k: int(v) for k, v in (kv.split("=") for kv in args.layers.split(",") if kv)}
    args.levels = {k: [int(c) for c in v.split(":")] for k, v in (kv.split("=") for kv in args.levels.split(",") if kv)}
    args.server_args = args.server_args.split()
    deadline = time.monotonic() + args.total_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_gbps() * 1e9   # bytes read plus written per second
    torch.cuda.empty_cache()   # the copy's 2 GiB go back before the servers start
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "copy_bandwidth_gbs": round(bandwidth / 1e9, 1), "n_requested": args.n,
           "background_concurrency": args.concurrency}
    results = [run_shape(name, args, out, deadline, bandwidth) for name in args.shapes.split(",")]
    (out / "backend_gpu.json").write_text(json.dumps({"env": env, "results": results}, indent=2))
    text = tables(results, bandwidth)
    (out / "backend_gpu.md").write_text(f"# Whitebox backend on {env['gpu']}\n\n{text}\n")
    plot(results, out / "backend_throughput.png")
    print(text)


if __name__ == "__main__":
    main()
