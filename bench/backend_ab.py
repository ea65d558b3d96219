"""Old code against new on one machine: bench/backend_gpu.py run from a git revision and from
the working tree in the order old, new, new, old (ABBA), so that the machine's drift over the
call falls on both sides. These machines differ by up to a quarter at 256 requests, and one
machine drifts by a few percent between calls, so code is compared only this way.

    python3 bench/backend_ab.py --old HEAD --runs qwen3-0.6b=1:32:256/invariant,llama3-8b=1/invariant \
        --out bench/results/backend_NAME_ab

Each run is `bench/backend_gpu.py --shapes SHAPE --levels SHAPE=LEVELS --modes MODE
--determinism "" --scoring "" --long-prompt 0` in its tree. Writes OUT.json (every run's
results) and OUT.md (the command, the mean of each side and new / old, then every run), and
prints the summary. Both are rewritten after every run, so a call cut short keeps what
finished. Where the checkout has no history (the GPU machines get a working tree only), unpack
the old revision beforehand and name it: `git archive REV --prefix=.old/ | tar -x`, then
`--old REV --old-tree .old`.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from md_table import markdown_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("old", "new", "new", "old")


def old_tree(repo: Path, rev: str, into: Path) -> Path:
    """The tracked files of `rev`, unpacked (git archive): what a clone at rev would run."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def parse_runs(text: str) -> list[tuple[str, str, str]]:
    """'shape=1:32/mode,...' -> [(shape, levels, mode)]."""
    runs = []
    for item in filter(None, text.split(",")):
        spec, _, mode = item.partition("/")
        shape, _, levels = spec.partition("=")
        if not (shape and levels and mode):
            raise SystemExit(f"--runs item {item!r} is not SHAPE=LEVELS/MODE")
        runs.append((shape, levels, mode))
    return runs


def run_one(tree: Path, shape: str, levels: str, mode: str, out: Path, timeout: float) -> dict | None:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "bench/backend_gpu.py", "--out", str(out), "--logs", str(out), "--shapes", shape,
           "--levels", f"{shape}={levels}", "--modes", mode, "--determinism", "", "--scoring", "",
           "--long-prompt", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout:.0f} s", flush=True)
        return None
    result = out / "backend_gpu.json"
    if done.returncode or not result.exists():
        print(f"  failed (rc {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}", flush=True)
        return None
    return json.loads(result.read_text())


def level_rows(tag: str, side: str, run: dict) -> list[dict]:
    """One row per concurrency level of one run."""
    rows = []
    for r in run["results"]:
        for mode in ("invariant", "standard"):
            for lv in r.get(mode, {}).get("latency", {}).get("levels", []):
                st = lv["per_step"]
                rows.append({"run": tag, "side": side, "model": r["shape"], "mode": mode, "concurrent": lv["concurrency"],
                             "tok/s": lv["tok_per_s"], "GPU us": round(st["gpu_forward_us"] + st["gpu_sampler_us"], 1),
                             "host in step us": st["host_in_step_us"], "of floor": lv["decode_of_floor"],
                             "TTFT p50 ms": lv["ttft_ms"][0], "ITL p50 ms": lv["itl_ms"][0]})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per model, mode and level: each side's mean tokens/s and new / old."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["mode"], r["concurrent"]), {}).setdefault(r["side"], []).append(r["tok/s"])
    out = []
    for (model, mode, level), sides in groups.items():
        old, new = (statistics.mean(sides[s]) if s in sides else None for s in ("old", "new"))
        out.append({"model": model, "mode": mode, "concurrent": level,
                    "old tok/s": " / ".join(str(x) for x in sides.get("old", [])),
                    "new tok/s": " / ".join(str(x) for x in sides.get("new", [])),
                    "new / old": f"{new / old:.3f}" if old and new else "-"})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose working tree is new")
    p.add_argument("--old", default="HEAD", help="the git revision to compare the working tree with")
    p.add_argument("--old-tree", type=Path, help="that revision already unpacked here (git archive)")
    p.add_argument("--runs", required=True, help="SHAPE=LEVELS/MODE,... e.g. qwen3-0.6b=1:32:256/invariant")
    p.add_argument("--out", required=True, help="path of the results without suffix: OUT.md, OUT.json")
    p.add_argument("--timeout-s", type=float, default=300, help="per run")
    args = p.parse_args()
    runs = parse_runs(args.runs)
    rows, raw = [], {}
    command = " ".join(["python3", "bench/backend_ab.py"] + sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="detgate_ab_") as tmp:
        old = args.old_tree.resolve() if args.old_tree else old_tree(args.repo, args.old, Path(tmp) / "old")
        trees = {"old": old, "new": args.repo}
        for shape, levels, mode in runs:
            for i, side in enumerate(ORDER):
                tag = f"{shape}/{mode}/{side}{ORDER[:i + 1].count(side)}"
                print(f"{tag}", flush=True)
                run = run_one(trees[side], shape, levels, mode, Path(tmp) / "runs" / tag.replace("/", "_"),
                              args.timeout_s)
                if run:
                    raw[tag] = run
                    rows += level_rows(tag, side, run)
                write(Path(args.out), command, args.old, raw, rows)
    print(markdown_table(summary(rows)))


def write(out: Path, command: str, old: str, raw: dict, rows: list[dict]) -> None:
    gpus = sorted({run["env"]["gpu"] for run in raw.values()})
    head = (f"`{command}` ({', '.join(gpus) or 'no run finished'}; old = {old}, new = the working tree; "
            f"order {', '.join(ORDER)} per run)")
    text = f"{head}\n\n{markdown_table(summary(rows))}\n\n## Every run\n\n{markdown_table(rows)}\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "old": old, "runs": raw}, indent=1))


if __name__ == "__main__":
    main()
