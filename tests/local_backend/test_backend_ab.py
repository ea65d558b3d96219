"""bench/backend_ab.py runs the old revision and the working tree in the order old, new, new,
old, and reports each side. Its subprocesses, git archive and files are real; the GPU benchmark
is a stand-in whose tokens/s is a number in the tree it runs from, so the table shows which
tree ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = textwrap.dedent('''
    import argparse, json, os
    from pathlib import Path
    p = argparse.ArgumentParser()
    for name in ("--out", "--logs", "--shapes", "--levels", "--modes", "--determinism", "--scoring", "--long-prompt"):
        p.add_argument(name)
    a = p.parse_args()
    speed = float(Path("speed.txt").read_text())
    with open(os.environ["AB_ORDER"], "a") as f:
        f.write(f"{a.shapes} {a.modes} {speed}\\n")
    levels = [int(c) for c in a.levels.split("=")[1].split(":")]
    step = {"gpu_forward_us": 900.0, "gpu_sampler_us": 100.0, "host_in_step_us": 15.0}
    rows = [{"concurrency": c, "tok_per_s": speed * c, "per_step": step, "decode_of_floor": 0.5,
             "ttft_ms": [9.0, 9.5], "itl_ms": [1.2, 1.5]} for c in levels]
    result = {"shape": a.shapes, a.modes: {"latency": {"levels": rows}}}
    Path(a.out, "backend_gpu.json").write_text(json.dumps({"env": {"gpu": "stand-in"}, "results": [result]}))
''')


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def repo_with_old_and_new(tmp_path: Path) -> Path:
    """A repository whose commit has speed 100 and whose working tree has 120."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "backend_gpu.py").write_text(STAND_IN)
    (repo / "speed.txt").write_text("100")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old")
    (repo / "speed.txt").write_text("120")   # the working tree, not committed
    return repo


def run_ab(tmp_path: Path, repo: Path, *old: str) -> tuple[Path, Path]:
    order, out = tmp_path / "order.txt", tmp_path / "results" / "ab"
    subprocess.run([sys.executable, str(ROOT / "bench" / "backend_ab.py"), "--repo", str(repo), *old,
                    "--runs", "tiny=1:4/invariant,other=2/standard", "--out", str(out)],
                   check=True, capture_output=True, env={**os.environ, "AB_ORDER": str(order)})
    return order, out


def test_old_and_new_run_in_abba_order(tmp_path):
    order, out = run_ab(tmp_path, repo_with_old_and_new(tmp_path), "--old", "HEAD")
    assert order.read_text().split("\n")[:8] == [
        "tiny invariant 100.0", "tiny invariant 120.0", "tiny invariant 120.0", "tiny invariant 100.0",
        "other standard 100.0", "other standard 120.0", "other standard 120.0", "other standard 100.0"]
    md = out.with_suffix(".md").read_text()
    assert "| tiny | invariant | 4 | 400.0 / 400.0 | 480.0 / 480.0 | 1.200 |" in md
    assert "| other | standard | 2 | 200.0 / 200.0 | 240.0 / 240.0 | 1.200 |" in md
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert sorted(runs) == sorted(f"{s}/{side}{i}" for s in ("tiny/invariant", "other/standard")
                                  for side in ("old", "new") for i in (1, 2))


def test_an_old_tree_unpacked_beforehand_runs_as_the_old_side(tmp_path):
    # As on a GPU machine, which gets the working tree without its history.
    repo = repo_with_old_and_new(tmp_path)
    subprocess.run(f"git -C {repo} archive HEAD --prefix=.old/ | tar -x -C {repo}", shell=True, check=True)
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)
    order, out = run_ab(tmp_path, repo, "--old", "abc1234", "--old-tree", str(repo / ".old"))
    assert order.read_text().split("\n")[:4] == [
        "tiny invariant 100.0", "tiny invariant 120.0", "tiny invariant 120.0", "tiny invariant 100.0"]
    assert "old = abc1234, new = the working tree" in out.with_suffix(".md").read_text()
