"""Sampling reductions on the GPU: invariant Triton kernels vs stock torch, in one run.

For B in {1, 32, 256} at V = 152064 (Qwen2/3) and bf16 / fp32 logits it times
log_softmax, logsumexp, argmax and the sampler (plain, top-k 50, top-p 0.9, both, and
top-k 8000, past the candidate list's cap)
against the torch equivalents (`kernels.mode("standard")`) on two clocks: eager
calls with the L2 flushed (triton.testing.do_bench, median; host launch cost
included) and GPU time from CUDA-graph replays (the kernels alone). Bandwidth
counts the fewest bytes each op must move (logits read once; log_softmax also
writes fp32 once) and is set against a device-to-device copy measured in the
same run.

It also counts unique outputs of one row placed alone and at random positions in
batches of random companions (bits for log_softmax, tokens for the samplers),
checks the GPU sampler against the fp64 CDF of the kept set (how many drawn tokens
hold u inside their step of the CDF, how many equal the CPU reference's token, how
many kept sets equal the reference's exactly), and that the `filtered` hint changes
no token on random mixed batches.

--before FILE times another version of kernels/sampling_triton.py (e.g. `git show
REV:kernels/sampling_triton.py > FILE`, one whose sample() takes the `filtered` hint) on the
four samplers in the same run, and counts the tokens it draws that equal this version's.

    python3 bench/kernels_sampling.py [--out bench/results] [--before FILE]
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import platform
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import mode, philox, sampling, sampling_triton  # noqa: E402
from kernels_dense import gpu_us, rotating  # noqa: E402  (this script's folder is on sys.path)

VOCAB = 152064
BATCHES = (1, 32, 256)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
FILTERS = {"sample": (0, 1.0), "sample top-k 50": (50, 1.0), "sample top-p 0.9": (0, 0.9),
           "sample top-k 50 + top-p 0.9": (50, 0.9),
           # past the candidate list's cap (kernels/sampling_candidates.py): the radix select's path
           "sample top-k 8000": (8000, 1.0)}


def copy_gbps() -> float:
    src = torch.randint(0, 255, (1 << 30,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / ms / 1e6


def logits_for(batch: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(batch, VOCAB, device="cuda", generator=g) * 4).to(dtype)


def sampling_args(batch: int, top_k: int, top_p: float, temperature: float = 0.8):
    dev = "cuda"
    return (torch.arange(batch, device=dev) * 1000003 + 17, torch.full((batch,), 7, device=dev),
            torch.full((batch,), temperature, device=dev), torch.full((batch,), top_k, dtype=torch.int32, device=dev),
            torch.full((batch,), top_p, device=dev))


def ops(batch: int, element_size: int, logits):
    """name -> (callable, fewest bytes moved); `logits()` gives the input of each call."""
    read = batch * VOCAB * element_size
    table = {
        "log_softmax": (lambda: sampling.log_softmax(logits()), read + batch * VOCAB * 4),
        "logsumexp": (lambda: sampling.logsumexp(logits()), read),
        "argmax": (lambda: sampling.argmax(logits()), read),
    }
    for name, (k, p) in FILTERS.items():
        args = sampling_args(batch, k, p)
        # The hint a caller gives from its request params: no host sync, so the call graphs.
        table[name] = ((lambda a=args, f=(k, p) != (0, 1.0): sampling.sample(logits(), *a, filtered=f)), read)
    return table


# The stock sampler syncs with the host (it checks whether any row filters), so it
# cannot be captured in a CUDA graph; the stock reductions can.
GRAPHABLE_STANDARD = ("log_softmax", "logsumexp", "argmax")


def time_ops(copy: float, before=None) -> list[dict]:
    """Two clocks per op. Eager: one call at a time with the L2 flushed (do_bench), which
    includes the host's launch cost whenever that is longer than the kernels. Graph: GPU
    time per call from CUDA-graph replays over enough input copies to defeat the L2 (at
    B=1 the copies fit in it): the kernels' own cost, as a decode step under a graph pays."""
    rows = []
    for dname, dtype in DTYPES.items():
        for batch in BATCHES:
            x = logits_for(batch, dtype, seed=batch)
            copies = rotating(lambda: x.clone(), x.numel() * x.element_size())
            eager, graph = ops(batch, x.element_size(), lambda: x), ops(batch, x.element_size(), copies)
            for name, (fn, nbytes) in eager.items():
                row = {"op": name, "dtype": dname, "B": batch, "bytes": nbytes}
                for m in ("invariant", "standard"):
                    with mode(m):
                        row[f"{m}_us"] = do_bench(fn, return_mode="median") * 1e3
                        can_graph = m == "invariant" or name in GRAPHABLE_STANDARD
                        row[f"{m}_graph_us"] = gpu_us(graph[name][0]) if can_graph else None
                    row[f"{m}_gbps"] = nbytes / row[f"{m}_graph_us" if can_graph else f"{m}_us"] / 1e3
                row["invariant_frac_copy"] = row["invariant_gbps"] / copy
                row["speedup_vs_standard"] = row["standard_us"] / row["invariant_us"]
                if before is not None and name in FILTERS:
                    args = sampling_args(batch, *FILTERS[name])
                    args = (*args, bool(sampling.row_filters(*args[2:], VOCAB).any()))
                    row["before_us"] = do_bench(lambda: before.sample(x, *args), return_mode="median") * 1e3
                    row["before_graph_us"] = gpu_us(lambda: before.sample(copies(), *args))
                rows.append(row)
                print(f"{dname} B={batch:3d} {name:28s} inv {row['invariant_us']:8.1f} us eager "
                      f"{row['invariant_graph_us']:8.1f} us graph  std {row['standard_us']:8.1f} us eager  "
                      f"{row['invariant_frac_copy']:.2f} of copy  before {row.get('before_graph_us', 0):8.1f} us graph",
                      flush=True)
    return rows


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.reshape(-1).cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def invariance_counts(contexts: int = 10) -> list[dict]:
    """Unique outputs of row 0 alone and inside `contexts` batches of random companions at random positions."""
    rows = []
    target = logits_for(1, torch.bfloat16, seed=999)
    companions = logits_for(512, torch.bfloat16, seed=1000)
    g = torch.Generator().manual_seed(5)
    for batch in (32, 256):
        layouts = [(0, target)]
        for _ in range(contexts):
            pos = int(torch.randint(batch, (1,), generator=g))
            others = companions[torch.randperm(512, generator=g)[: batch - 1].cuda()]
            layouts.append((pos, torch.cat([others[:pos], target, others[pos:]])))
        for name in ("log_softmax", "argmax", *FILTERS):
            counts = {}
            for m in ("invariant", "standard"):
                seen = set()
                for pos, x in layouts:
                    with mode(m):
                        if name == "log_softmax":
                            out = sampling.log_softmax(x)[pos]
                        elif name == "argmax":
                            out = sampling.argmax(x)[pos]
                        else:
                            # Target row gets the same seed/step everywhere; standard mode is given the
                            # same global seed before every call, like an engine seeding its batch generator.
                            args = [a.clone() for a in sampling_args(x.shape[0], *FILTERS[name])]
                            args[0][pos] = 42
                            torch.manual_seed(42)
                            out = sampling.sample(x, *args)[pos]
                    seen.add(digest(out))
                counts[m] = len(seen)
            rows.append({"op": name, "B": batch, "placements": len(layouts),
                         "unique_invariant": counts["invariant"], "unique_standard": counts["standard"]})
            print(f"invariance B={batch} {name:28s} unique: invariant {counts['invariant']}, "
                  f"standard {counts['standard']} of {len(layouts)}", flush=True)
    return rows


def cross_device() -> dict:
    """GPU kernel vs the torch reference on the CPU and on the GPU, same fp32 logits and params."""
    g = torch.Generator().manual_seed(77)
    batch = 32
    x = (torch.randn(batch, VOCAB, generator=g) * 4).mul(2).round().div(2)  # ties included
    temperature = torch.rand(batch, generator=g) + 0.3
    top_k = torch.where(torch.arange(batch) % 3 == 0, 0, torch.randint(1, 200, (batch,), generator=g)).int()
    top_p = torch.where(torch.arange(batch) % 2 == 0, 1.0, torch.rand(batch, generator=g) * 0.9 + 0.05)
    seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=g)
    steps = torch.randint(0, 2**40, (batch,), generator=g)
    cpu_args = (seeds, steps, temperature, top_k, top_p)
    gpu_args = tuple(a.cuda() for a in cpu_args)
    with mode("invariant"):
        kernel = sampling.sample(x.cuda(), *gpu_args).cpu()
        argmax_gpu = sampling.argmax(x.cuda()).cpu()
    on_cpu = sampling.sample_reference(x, *cpu_args)
    on_gpu = sampling.sample_reference(x.cuda(), *gpu_args).cpu()
    scaled = sampling.scale(x, temperature)
    keep = sampling.keep_mask(scaled, top_k, top_p)
    cdf = sampling.kept_cdf(scaled, keep)
    u = philox.row_uniform_reference(seeds, steps).double()
    rows = torch.arange(batch)
    lower = torch.where(kernel > 0, cdf[rows, (kernel - 1).clamp_min(0)], 0.0)
    upper = cdf[rows, kernel]
    inside = keep[rows, kernel] & (lower <= u) & (u < upper)
    result = {"rows": batch, "kernel_vs_cpu_reference": int((kernel == on_cpu).sum()),
              "kernel_vs_gpu_reference": int((kernel == on_gpu).sum()),
              "kernel_token_holds_u_in_its_cdf_step": int(inside.sum()),
              "largest_miss_of_u": float(torch.clamp(torch.maximum(lower - u, u - upper), min=0).max()),
              "argmax_vs_cpu_reference": int((argmax_gpu == sampling.argmax_reference(x)).sum()),
              "uniforms_equal": torch.equal(sampling_triton.row_uniforms(gpu_args[0], gpu_args[1]).cpu(),
                                            philox.row_uniform_reference(seeds, steps))}
    print("cross-device:", result, flush=True)
    return result


def random_params(g: torch.Generator, batch: int):
    temperature = torch.where(torch.rand(batch, generator=g) < 0.2, 0.0, torch.rand(batch, generator=g) * 1.5 + 0.1)
    top_k = torch.where(torch.rand(batch, generator=g) < 0.5, 0, torch.randint(1, 2000, (batch,), generator=g)).int()
    top_p = torch.where(torch.rand(batch, generator=g) < 0.5, 1.0, torch.rand(batch, generator=g))
    seeds = torch.randint(-2**63, 2**63 - 1, (batch,), generator=g)
    steps = torch.randint(0, 2**40, (batch,), generator=g)
    return [t.cuda() for t in (seeds, steps, temperature, top_k, top_p)]


def hint_checks(before=None, batches: int = 24) -> dict:
    """Random mixed batches at V = 152064: tokens with filtered=True equal those with no hint
    (one sync), and for batches that filter nowhere filtered=False and True equal them too.
    Also kept sets equal to the fp64 reference's exactly, and tokens equal to `before`'s."""
    g = torch.Generator().manual_seed(31)
    same_hint = same_unfiltered = same_before = drawn_before = same_before_free = 0
    with mode("invariant"):
        for i in range(batches):
            batch = int(torch.randint(1, 48, (1,), generator=g))
            dtype = (torch.bfloat16, torch.float32)[i % 2]
            x = ((torch.randn(batch, VOCAB, generator=g) * 4).mul(2).round().div(2) if i % 3 == 0
                 else torch.randn(batch, VOCAB, generator=g) * 4).to("cuda", dtype)
            args = random_params(g, batch)
            plain = sampling.sample(x, *args)
            same_hint += torch.equal(plain, sampling.sample(x, *args, filtered=True))
            free = args[:3] + [torch.zeros_like(args[3]), torch.ones_like(args[4])]
            plain_free = sampling.sample(x, *free)
            same_unfiltered += (torch.equal(plain_free, sampling.sample(x, *free, filtered=False))
                                and torch.equal(plain_free, sampling.sample(x, *free, filtered=True)))
            if before is not None:
                same_before += int((plain == before.sample(x, *args, True)).sum())
                same_before_free += int((plain_free == before.sample(x, *free, False)).sum())
                drawn_before += batch
        x = (torch.randn(16, VOCAB, generator=g) * 4).mul(2).round().div(2)  # ties on the boundaries
        args = random_params(g, 16)
        args[2] = args[2].clamp_min(0.3)
        threshold, cut, settled = sampling_triton.kept_bounds(x.cuda(), *args[2:]).cpu().unbind(-1)
    scaled = sampling.scale(x, args[2].cpu())
    bits = scaled.view(torch.int32)
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    kept = (keys > threshold.view(-1, 1)) | ((keys == threshold.view(-1, 1)) & (torch.arange(VOCAB) <= cut.view(-1, 1)))
    exact = int((kept == sampling.keep_mask(scaled, args[3].cpu(), args[4].cpu())).all(dim=-1).sum())
    result = {"batches": batches, "hint_true_equals_no_hint": same_hint,
              "unfiltered_hint_false_and_true_equal_no_hint": same_unfiltered,
              "kept_set_rows": 16, "kept_set_exact": exact, "kept_set_rows_settled_by_candidates": int(settled.sum())}
    if before is not None:
        result.update(tokens_equal_before=same_before, unfiltered_tokens_equal_before=same_before_free,
                      tokens_drawn=drawn_before)
    print("hint and kept-set checks:", result, flush=True)
    return result


def load_before(path: str):
    spec = importlib.util.spec_from_file_location("sampling_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown(meta: dict, rows: list[dict], inv: list[dict], cross: dict, checks: dict) -> str:
    lines = [
        "# Sampling reductions: invariant Triton vs stock torch",
        "",
        f"{meta['gpu']}, torch {meta['torch']}, V = {VOCAB}, copy bandwidth {meta['copy_gbps']:.0f} GB/s "
        "(read + write, measured in the same run). Sampling at temperature 0.8. Two clocks: *eager* is one call "
        "at a time with the L2 flushed (triton do_bench, median), and includes the host's launch cost wherever "
        "that exceeds the GPU work (small B: 2 Triton launches per call); *graph* is GPU time per call "
        "from CUDA-graph replays over input copies that defeat the L2 (at B=1 they fit in it). GB/s and the "
        "fraction of copy bandwidth use the graph time and the fewest bytes (logits read once, log_softmax "
        "output written once). The stock sampler syncs with the host, so it has no graph time.",
        "",
        "| dtype | B | op | invariant µs eager | invariant µs graph | torch µs eager | torch µs graph "
        "| torch / invariant (eager) | invariant GB/s (graph) | of copy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        std_graph = "-" if r["standard_graph_us"] is None else f"{r['standard_graph_us']:.1f}"
        lines.append(f"| {r['dtype']} | {r['B']} | {r['op']} | {r['invariant_us']:.1f} | {r['invariant_graph_us']:.1f} "
                     f"| {r['standard_us']:.1f} | {std_graph} | {r['speedup_vs_standard']:.2f} "
                     f"| {r['invariant_gbps']:.0f} | {r['invariant_frac_copy']:.2f} |")
    lines += ["", "## Unique outputs of one row, alone and at random positions among random companions (bf16)", "",
              "| B | op | placements | unique (invariant) | unique (torch) |", "|---|---|---|---|---|"]
    for r in inv:
        lines.append(f"| {r['B']} | {r['op']} | {r['placements']} | {r['unique_invariant']} | {r['unique_standard']} |")
    lines += ["", "Torch sampling has no per-row seed: the global generator is re-seeded to 42 before every call.",
              "", "## GPU kernel vs torch reference (fp32 logits with ties, mixed params)", "",
              f"- drawn tokens whose step of the fp64 kept-set CDF holds u: "
              f"{cross['kernel_token_holds_u_in_its_cdf_step']} / {cross['rows']} "
              f"(largest miss {cross['largest_miss_of_u']:.1e})",
              f"- sampled tokens equal to the CPU reference: {cross['kernel_vs_cpu_reference']} / {cross['rows']}",
              f"- sampled tokens equal to the reference run on the GPU: {cross['kernel_vs_gpu_reference']} / {cross['rows']}",
              f"- argmax equal to the CPU reference: {cross['argmax_vs_cpu_reference']} / {cross['rows']}",
              f"- Philox uniforms bit-equal GPU vs CPU: {cross['uniforms_equal']}", "",
              "## Host hint and kept sets (random mixed batches, B 1-47, bf16 / fp32, a third tie-heavy)", "",
              f"- tokens with filtered=True bit-equal to no hint (one device sync): "
              f"{checks['hint_true_equals_no_hint']} / {checks['batches']} batches",
              f"- same batches without top-k/top-p, filtered=False and =True equal to no hint: "
              f"{checks['unfiltered_hint_false_and_true_equal_no_hint']} / {checks['batches']}",
              f"- kept sets at V = {VOCAB} (fp32, ties) equal to the fp64 reference's exactly: "
              f"{checks['kept_set_exact']} / {checks['kept_set_rows']} rows "
              f"({checks['kept_set_rows_settled_by_candidates']} settled from the candidate list, the rest "
              "by the radix select)"]
    if "tokens_drawn" in checks:
        lines.append(f"- tokens equal to the `--before` version's on those batches: "
                     f"{checks['tokens_equal_before']} / {checks['tokens_drawn']}; without top-k/top-p: "
                     f"{checks['unfiltered_tokens_equal_before']} / {checks['tokens_drawn']}")
    before = [r for r in rows if "before_graph_us" in r]
    if before:
        lines += ["", "## Samplers against the `--before` version (same run)", "",
                  "| dtype | B | op | before µs graph | now µs graph | before µs eager | now µs eager | torch µs eager |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in before:
            lines.append(f"| {r['dtype']} | {r['B']} | {r['op']} | {r['before_graph_us']:.1f} | "
                         f"{r['invariant_graph_us']:.1f} | {r['before_us']:.1f} | {r['invariant_us']:.1f} | "
                         f"{r['standard_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--before", help="another kernels/sampling_triton.py to time alongside")
    args = parser.parse_args()
    before = load_before(args.before) if args.before else None
    copy = copy_gbps()
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
            "copy_gbps": copy}
    print(f"{meta['gpu']}: copy {copy:.0f} GB/s", flush=True)
    cross = cross_device()
    checks = hint_checks(before)
    inv = invariance_counts()
    rows = time_ops(copy, before)
    result = {"meta": meta, "timings": rows, "invariance": inv, "cross_device": cross, "checks": checks}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_sampling.json").write_text(json.dumps(result, indent=1))
    md = markdown(meta, rows, inv, cross, checks)
    (out / "kernels_sampling.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
