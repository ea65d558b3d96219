"""The chat hit path of this tree against the same path of an earlier revision, on one machine.

The gateway bench compares a hit with a bare aiohttp server; on a shared 2-core machine
that ratio moves by a few hundredths between runs. This asks the narrower question of
whether a change made hits dearer: a gateway from this tree and one from REV (checked out
into a temporary git worktree), both with the in-process store, behind one fake upstream,
driven in alternating wrk runs, so both see the same machine at nearly the same moments.

    python3 bench/gateway_ab.py f5f29f3 [--rounds 3] [--seconds 8]

Prints a table and writes bench/results/gateway_ab.md and .json. Needs `wrk` and git.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gateway_bench import HIT_BODY, RESULTS, SECRET, post, wait_http, wrk_script

from fakes.loopback import free_port  # noqa: E402  (gateway_bench put tests/ on the path)

REPO = Path(__file__).resolve().parents[1]


def requests_per_s(url: str, script: Path, seconds: int) -> float:
    out = subprocess.run(["wrk", "-t1", "-c32", f"-d{seconds}s", "-s", str(script), url + "/v1/chat/completions"],
                         capture_output=True, text=True, check=True).stdout
    return float(next(line for line in out.splitlines() if line.startswith("Requests/sec")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the revision to compare with, e.g. a commit before a change")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="detgate-ab-"))
    other = tmp / "other"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(other), args.rev], cwd=REPO, check=True)
    procs: list[subprocess.Popen] = []
    try:
        upstream_port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "tests")))}
        procs.append(subprocess.Popen([sys.executable, "tests/fakes/openai_upstream.py", "--port", str(upstream_port)],
                                      cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        gateways = {}
        for name, tree in (("this tree", REPO), (args.rev, other)):
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--secret", SECRET,
                 "--upstream", f"fake=http://127.0.0.1:{upstream_port}/v1"],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
            gateways[name] = f"http://127.0.0.1:{port}"
        body = json.dumps(HIT_BODY).encode()
        for url in gateways.values():
            wait_http(url + "/healthz")
            post(url + "/v1/chat/completions", body)
            assert post(url + "/v1/chat/completions", body)[0]["x-detgate-cache"] == "hit"
        script = wrk_script(tmp, "hit", body)
        runs: dict[str, list[float]] = {name: [] for name in gateways}
        for _ in range(args.rounds):
            for name, url in gateways.items():
                runs[name].append(requests_per_s(url, script, args.seconds))
    finally:
        for proc in procs:
            proc.terminate()
        subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=REPO, check=False)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    ratio = medians["this tree"] / medians[args.rev]
    rows = [f"| {name} | {' / '.join(f'{v:.0f}' for v in values)} | {medians[name]:.0f} |"
            for name, values in runs.items()]
    table = "\n".join(["| gateway | req/s per round (c=32, memory store) | median |", "|---|---|---|", *rows])
    text = (f"# Gateway hit path: this tree against {args.rev}\n\n`python3 bench/gateway_ab.py {args.rev} "
            f"--rounds {args.rounds} --seconds {args.seconds}`, wrk -t1 -c32, alternating runs.\n\n{table}\n\n"
            f"This tree / {args.rev}: **{ratio:.2f}×**\n")
    print(text)
    (RESULTS / "gateway_ab.md").write_text(text)
    (RESULTS / "gateway_ab.json").write_text(json.dumps({"rev": args.rev, "runs": runs, "ratio": ratio}, indent=2) + "\n")


if __name__ == "__main__":
    main()
