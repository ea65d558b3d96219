"""Dense kernels on the GPU: invariant matmul and RMSNorm against the vendor path.

One run measures the machine's ceilings, times every op against its vendor
baseline, counts rows whose bits change with the batch size, checks run-to-run
bit identity, and (with --tests) runs the kernel tests at real sizes. It prints
a table and writes kernels_dense.{md,json,png} to --out.

    python3 bench/kernels_dense.py [--out bench/results] [--sweep] [--tests]

--sweep also times every candidate tile configuration of both matmul kernels
and checks which of them give the same bits, the data behind matmul.CONFIGS.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.matmul import CONFIGS, _matmul_triton, matmul  # noqa: E402
from kernels.mode import mode  # noqa: E402
from kernels.norm import rms_norm, rms_norm_residual  # noqa: E402

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N), Llama-3-8B projections
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
NORM_HIDDEN = (4096, 8192)
NORM_BATCHES = (1, 16, 128, 1024, 4096, 16384, 65536)
SWEEP_BATCHES = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SWEEP_CONFIGS = (  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    (128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 4), (128, 128, 4, 4), (128, 64, 4, 5),
    (64, 256, 4, 4), (64, 128, 4, 5), (64, 64, 4, 6), (64, 32, 4, 8),
    (32, 64, 4, 6), (16, 64, 4, 6), (16, 32, 4, 8),
)


def gpu_us(fn, target_ms: float = 3.0, replays: int = 15) -> float:
    """Median GPU time of one call, from CUDA-graph replays of many calls.

    A graph removes host launch gaps, which would otherwise dominate the
    microsecond-scale decode shapes and hide the kernels' own speed.
    """
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    calls = max(1, min(200, int(target_ms / max(start.elapsed_time(end) / 5, 1e-3))))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def paired_us(fn, rounds: int = 3) -> tuple[float, float]:
    """(standard, invariant) median times of fn, the two modes timed in turn `rounds` times.

    One kernel timed twice a few seconds apart has differed by 15% here (GPU clocks and
    power move), so each mode gets several turns and both see the same spread of states.
    """
    times = {"standard": [], "invariant": []}
    for _ in range(rounds):
        for name in times:
            with mode(name):
                times[name].append(gpu_us(fn))
    return statistics.median(times["standard"]), statistics.median(times["invariant"])


def l2_copies(nbytes: int, times: int = 3, most: int | None = 64) -> int:
    """Copies of an nbytes input that together make `times` the L2 (capped at `most`):
    cycling through them, each call reads its input from memory, not from the cache."""
    want = math.ceil(times * torch.cuda.get_device_properties(0).L2_cache_size / nbytes)
    return max(1, want if most is None else min(most, want))


def rotating(make, nbytes: int):
    """Cycles through l2_copies() copies of an input, one per call."""
    copies = [make() for _ in range(l2_copies(nbytes))]
    state = {"i": 0}

    def next_copy():
        state["i"] = (state["i"] + 1) % len(copies)
        return copies[state["i"]]
    return next_copy


def ceilings() -> dict:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    gpu_us(lambda: a @ b, target_ms=200)  # bring the clocks up before anything is timed
    mm_us = gpu_us(lambda: a @ b, target_ms=20)
    copy_GBps = 0.0
    for n in (1 << 26, 1 << 28, 1 << 30):  # bf16 elements each way: 128 MiB to 2 GiB
        src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        copy_GBps = max(copy_GBps, 2 * n * 2 / gpu_us(lambda: dst.copy_(src), target_ms=20) / 1e3)
    return {"copy_GBps": copy_GBps, "cublas_bf16_8192_TFLOPs": 2 * 8192 ** 3 / mm_us / 1e6}


def bits_summary(out: torch.Tensor) -> str:
    return hashlib.sha256(out.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def bench_matmul(ceil: dict) -> list[dict]:
    rows = []
    for K, N in SHAPES:
        weights = rotating(lambda: torch.randn(N, K, device="cuda", dtype=torch.bfloat16), N * K * 2)
        for M in BATCHES:
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            flops = 2 * M * N * K
            cublas, inv = paired_us(lambda: matmul(a, weights().t()))
            # The weights must cross memory once: the floor for small M.
            floor_us = max(flops / (ceil["cublas_bf16_8192_TFLOPs"] * 1e6),
                           (N * K + M * K + M * N) * 2 / (ceil["copy_GBps"] * 1e3))
            rows.append({
                "K": K, "N": N, "M": M, "cublas_us": cublas, "invariant_us": inv,
                "cublas_TFLOPs": flops / cublas / 1e6, "invariant_TFLOPs": flops / inv / 1e6,
                "speed_vs_cublas": cublas / inv, "floor_us": floor_us, "invariant_of_floor": floor_us / inv,
            })
            print(f"matmul K={K:5d} N={N:5d} M={M:5d}  cublas {cublas:8.1f} us  invariant {inv:8.1f} us"
                  f"  speed {cublas / inv:5.2f}x", flush=True)
    return rows


def bench_layouts() -> list[dict]:
    """Weight stored [N, K] (passed as .t()) against [K, N] contiguous."""
    rows = []
    for K, N in SHAPES:
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        w_kn = w.t().contiguous()
        for M in (1, 64, 4096):
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            t_nk = gpu_us(lambda: matmul(a, w.t()))
            t_kn = gpu_us(lambda: matmul(a, w_kn))
            same = torch.equal(matmul(a, w.t()), matmul(a, w_kn))
            rows.append({"K": K, "N": N, "M": M, "weight_NK_us": t_nk, "weight_KN_us": t_kn, "same_bits": same})
    return rows


def host_overhead() -> list[dict]:
    """Wall time per eager call at decode size, host launch cost included (no graph)."""
    rows = []
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    for name, run, fn in (("matmul", "standard", lambda: matmul(x, w.t())), ("matmul", "invariant", lambda: matmul(x, w.t())),
                          ("rms_norm", "standard", lambda: rms_norm(x, w[0], 1e-6)),
                          ("rms_norm", "invariant", lambda: rms_norm(x, w[0], 1e-6))):
        with mode(run):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(500):
                fn()
            torch.cuda.synchronize()
            rows.append({"op": name, "path": run, "eager_us_per_call": (time.perf_counter() - t0) / 500 * 1e6})
    return rows


def matmul_invariance() -> list[dict]:
    """Rows of an 8192-row batch against the same rows computed in smaller batches."""
    rows = []
    # Drawn on the CPU so that the output digests can be compared across GPUs.
    gen = torch.Generator().manual_seed(0)
    for K, N in SHAPES:
        w = torch.randn(N, K, generator=gen).to("cuda", torch.bfloat16)
        bias = torch.randn(N, generator=gen).to("cuda", torch.bfloat16)
        a = torch.randn(8192, K, generator=gen).to("cuda", torch.bfloat16)
        for name, run in (("invariant", "invariant"), ("cublas", "standard")):
            with mode(run):
                full = matmul(a, w.t(), bias)
                bad = checked = 0
                for M in BATCHES[:-1]:
                    bad += int((matmul(a[:M], w.t(), bias) != full[:M]).any(dim=1).sum())
                    checked += M
                # Single rows at spread-out positions, each computed alone.
                for i in range(0, 8192, 257):
                    bad += int(not torch.equal(matmul(a[i:i + 1], w.t(), bias)[0], full[i]))
                    checked += 1
                again = torch.equal(matmul(a, w.t(), bias), full)
            rows.append({"K": K, "N": N, "path": name, "rows_checked": checked, "rows_differing": bad,
                         "run_to_run_identical": again, "sha256_prefix": bits_summary(full)})
    return rows


def bench_norm(ceil: dict) -> list[dict]:
    rows = []
    for H in NORM_HIDDEN:
        w = torch.randn(H, device="cuda", dtype=torch.bfloat16)
        for M in NORM_BATCHES:
            xs = rotating(lambda: torch.randn(M, H, device="cuda", dtype=torch.bfloat16), M * H * 2)
            res = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
            nbytes, fused_bytes = 2 * M * H * 2, 4 * M * H * 2
            with mode("standard"):
                torch_us = gpu_us(lambda: rms_norm(xs(), w, 1e-6))
                torch_fused_us = gpu_us(lambda: rms_norm_residual(xs(), res, w, 1e-6))
            with mode("invariant"):
                inv_us = gpu_us(lambda: rms_norm(xs(), w, 1e-6))
                inv_fused_us = gpu_us(lambda: rms_norm_residual(xs(), res, w, 1e-6))
            rows.append({
                "H": H, "M": M, "torch_us": torch_us, "invariant_us": inv_us,
                "torch_GBps": nbytes / torch_us / 1e3, "invariant_GBps": nbytes / inv_us / 1e3,
                "invariant_of_copy_bw": nbytes / inv_us / 1e3 / ceil["copy_GBps"],
                "torch_fused_us": torch_fused_us, "invariant_fused_us": inv_fused_us,
                "invariant_fused_of_copy_bw": fused_bytes / inv_fused_us / 1e3 / ceil["copy_GBps"],
            })
            print(f"rms_norm H={H} M={M:6d}  torch {torch_us:7.1f} us  invariant {inv_us:7.1f} us"
                  f"  {rows[-1]['invariant_of_copy_bw']:.0%} of copy bw", flush=True)
    return rows


def norm_invariance() -> list[dict]:
    rows = []
    for H in NORM_HIDDEN:
        x = torch.randn(16384, H, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(H, device="cuda", dtype=torch.bfloat16)
        full = rms_norm(x, w, 1e-6)
        bad = sum(int((rms_norm(x[:M], w, 1e-6) != full[:M]).any(dim=1).sum()) for M in NORM_BATCHES[:-2])
        bad += sum(int(not torch.equal(rms_norm(x[i:i + 1], w, 1e-6)[0], full[i])) for i in range(0, 16384, 509))
        rows.append({"H": H, "rows_differing": bad, "run_to_run_identical": torch.equal(rms_norm(x, w, 1e-6), full)})
    return rows


def sweep() -> list[dict]:
    """Time every candidate tile config of both kernels and compare its bits with the shipped dispatch."""
    rows = []
    for K, N in SHAPES:
        weights = rotating(lambda: torch.randn(N, K, device="cuda", dtype=torch.bfloat16), N * K * 2)
        probe_a = torch.randn(300, K, device="cuda", dtype=torch.bfloat16)
        probe_w = weights()
        reference = matmul(probe_a, probe_w.t())  # the shipped dispatch
        for kernel in ("tma", "pointer"):
            for config in SWEEP_CONFIGS:
                try:
                    out = _matmul_triton(probe_a, probe_w.t(), None, (*config, kernel))
                    torch.cuda.synchronize()
                except Exception as exc:  # out of shared memory and the like: record, go on
                    rows.append({"K": K, "N": N, "kernel": kernel, "config": config, "error": str(exc)[:200]})
                    continue
                same = torch.equal(out, reference)
                for M in SWEEP_BATCHES:
                    if (config[0] >= 128 and M < 64) or (config[0] <= 32 and M > 1024):
                        continue
                    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                    us = gpu_us(lambda: _matmul_triton(a, weights().t(), None, (*config, kernel)), target_ms=1, replays=5)
                    rows.append({"K": K, "N": N, "kernel": kernel, "config": config, "M": M, "us": us,
                                 "same_bits": same})
                print(f"sweep K={K} N={N} {kernel:7s} {config} same_bits={same}", flush=True)
    return rows


def run_tests(out: Path) -> dict:
    here = Path(__file__).resolve().parents[1]
    t0 = time.time()
    with open(out / "kernels_dense_tests.log", "w") as log:
        proc = subprocess.run(
            # confcutdir: the kernel tests need none of the server-side fixtures above tests/kernels.
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--confcutdir=tests/kernels",
             "tests/kernels/test_matmul.py", "tests/kernels/test_norm.py"],
            cwd=here, stdout=log, stderr=subprocess.STDOUT, text=True)
    tail = (out / "kernels_dense_tests.log").read_text()[-3000:]
    return {"returncode": proc.returncode, "seconds": time.time() - t0, "tail": tail}


def plot(matmul_rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(6 * len(SHAPES), 4.5), sharey=True)
    for ax, (K, N) in zip(axes, SHAPES):
        rs = [r for r in matmul_rows if r["K"] == K and r["N"] == N]
        ms = [r["M"] for r in rs]
        ax.plot(ms, [r["cublas_TFLOPs"] for r in rs], "o-", label="cuBLAS (standard)")
        ax.plot(ms, [r["invariant_TFLOPs"] for r in rs], "s-", label="invariant Triton")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"bf16 matmul K={K} N={N}")
        ax.set_xlabel("M (rows in the batch)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(res: dict) -> str:
    c = res["ceilings"]
    lines = [f"# Dense kernels: invariant vs vendor ({res['device']})", "",
             f"Ceilings measured in the same run: device copy {c['copy_GBps']:.0f} GB/s (read + write), "
             f"cuBLAS bf16 8192^3 {c['cublas_bf16_8192_TFLOPs']:.0f} TFLOP/s.", "",
             f"Tile configs (BLOCK_M, BLOCK_N, warps, stages): `{res['configs']}`", "",
             "## matmul (bf16, weight stored [N, K], GPU time from CUDA-graph replays; median of 3 turns, cuBLAS and invariant in alternation)", "",
             "| K | N | M | cuBLAS us | invariant us | cuBLAS TFLOP/s | invariant TFLOP/s | speed vs cuBLAS | of floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["matmul"]:
        lines.append(f"| {r['K']} | {r['N']} | {r['M']} | {r['cublas_us']:.1f} | {r['invariant_us']:.1f} | "
                     f"{r['cublas_TFLOPs']:.1f} | {r['invariant_TFLOPs']:.1f} | {r['speed_vs_cublas']:.2f} | "
                     f"{r['invariant_of_floor']:.0%} |")
    lines += ["", "## matmul bit invariance (rows of an 8192-row batch recomputed in batches of 1..4096 and alone)", "",
              "| K | N | path | rows checked | rows differing | run-to-run identical | sha256 prefix of the 8192-row output |",
              "|---|---|---|---|---|---|---|"]
    for r in res["matmul_invariance"]:
        lines.append(f"| {r['K']} | {r['N']} | {r['path']} | {r['rows_checked']} | {r['rows_differing']} | "
                     f"{r['run_to_run_identical']} | `{r['sha256_prefix']}` |")
    lines += ["", "## weight layout", "", "| K | N | M | [N,K] passed as .t() us | [K,N] contiguous us | same bits |",
              "|---|---|---|---|---|---|"]
    for r in res["layouts"]:
        lines.append(f"| {r['K']} | {r['N']} | {r['M']} | {r['weight_NK_us']:.1f} | {r['weight_KN_us']:.1f} | {r['same_bits']} |")
    lines += ["", "## host cost of one eager call at M=1, H=4096 (wall clock, no CUDA graph)", "",
              "| op | path | us per call |", "|---|---|---|"]
    for r in res["host"]:
        lines.append(f"| {r['op']} | {r['path']} | {r['eager_us_per_call']:.1f} |")
    lines += ["", "## RMSNorm (bf16)", "",
              "| H | M | torch us | invariant us | torch GB/s | invariant GB/s | of copy bw | fused+residual: torch us | invariant us | of copy bw |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["norm"]:
        lines.append(f"| {r['H']} | {r['M']} | {r['torch_us']:.1f} | {r['invariant_us']:.1f} | {r['torch_GBps']:.0f} | "
                     f"{r['invariant_GBps']:.0f} | {r['invariant_of_copy_bw']:.0%} | {r['torch_fused_us']:.1f} | "
                     f"{r['invariant_fused_us']:.1f} | {r['invariant_fused_of_copy_bw']:.0%} |")
    lines += ["", "RMSNorm bit invariance: " + ", ".join(
        f"H={r['H']}: {r['rows_differing']} rows differ, run-to-run identical {r['run_to_run_identical']}"
        for r in res["norm_invariance"])]
    if "tests" in res:
        lines += ["", f"Kernel tests at real sizes on this GPU: exit {res['tests']['returncode']}, "
                  f"{res['tests']['seconds']:.0f} s", "", "```", res["tests"]["tail"].strip()[-1500:], "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--tests", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/kernels_dense.py needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "configs": CONFIGS}
    res["ceilings"] = ceilings()
    print(res["ceilings"], flush=True)
    res["matmul_invariance"] = matmul_invariance()
    res["norm_invariance"] = norm_invariance()
    res["matmul"] = bench_matmul(res["ceilings"])
    res["layouts"] = bench_layouts()
    res["norm"] = bench_norm(res["ceilings"])
    res["host"] = host_overhead()
    plot(res["matmul"], out / "kernels_dense.png")
    write(res, out)
    print(markdown(res))
    if args.tests:
        res["tests"] = run_tests(out)
        write(res, out)
        print(res["tests"]["tail"][-1500:], flush=True)
    if args.sweep:
        (out / "kernels_dense_sweep.json").write_text(json.dumps(sweep(), indent=1))


def write(res: dict, out: Path) -> None:
    (out / "kernels_dense.json").write_text(json.dumps(res, indent=1))
    (out / "kernels_dense.md").write_text(markdown(res))


if __name__ == "__main__":
    main()
