"""Coding-agent requests on the cache-hit path: what preparing one costs (parse, validate,
policy with its schema checks, canonical form, key) and what a whole hit costs over HTTP,
for the last request of a real Claude Code run (24 tools, ~80 KB) and of a Codex run
(~65 KB), beside a small chat body as the baseline in the same run.

One run starts a fake OpenAI and a fake Anthropic upstream and a gateway with the
in-process store, stores each body's answer with one miss, then times sequential hits
over one keep-alive connection (latency and the gateway's CPU per request); `prepare` is
also timed in this process alone. Prints a table and writes bench/results/<out>.json/.md.

    python3 bench/agent_prepare.py [--hits 200] [--prepares 200] [--out agent_prepare]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fakes.loopback import free_port  # noqa: E402  (test tooling, found via the path above)
from gateway_bench import cpu_seconds, wait_http  # noqa: E402
from gateway.policy.prepare import PreparedMemo  # noqa: E402

RESULTS = REPO / "bench" / "results"
FIXTURES = REPO / "tests" / "agents" / "fixtures"
SECRET = "bench-secret"
CHAT = {"model": "fake/bench-model", "messages": [{"role": "user", "content": "What is a deterministic cache?"}],
        "temperature": 0}
# Headers the gateway must not be sent as captured: the connection's own, and the length it recomputes.
DROPPED = {"host", "content-length", "connection", "accept-encoding"}


def cases() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(name, path, body bytes, headers) of each body timed: the baseline first."""
    out = [("chat (baseline)", "/v1/chat/completions", json.dumps(CHAT).encode(), {"content-type": "application/json"})]
    for name, fixture in (("claude code", "claude-run1.json"), ("codex", "codex-run1.json")):
        post = json.loads((FIXTURES / fixture).read_text())["last_post"]
        headers = {k: v for k, v in post["headers"].items() if k.lower() not in DROPPED}
        out.append((name, post["path"], post["body"].encode(), headers))
    return out


def prepare_times(upstreams: list, body_cases: list, n: int) -> dict[str, float]:
    """Median microseconds of `prepare` per body, in this process (what a hit spends before
    it asks the store), after one warm-up call each."""
    from multidict import CIMultiDict
    from types import SimpleNamespace

    from gateway.apis import SURFACES
    from gateway.config import Settings
    from gateway.ingress.auth import Tenants
    from gateway.policy.prepare import prepare
    from gateway.route.cached import asked

    settings = Settings(upstreams=upstreams)
    tenants = Tenants.from_settings(settings)
    routes = {"/v1/chat/completions": "chat.completions", "/v1/messages": "messages", "/v1/responses": "responses"}
    out = {}
    for name, path, raw, headers in body_cases:
        surface = SURFACES[routes[path]]
        request = asked(SimpleNamespace(headers=CIMultiDict(headers)), surface)
        prepare(surface, raw, request, settings, tenants, SECRET.encode())
        times = []
        for _ in range(n):
            start = time.perf_counter()
            prepare(surface, raw, request, settings, tenants, SECRET.encode())
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times) * 1e6
    return out


def hit_times(port: int, pid: int, path: str, raw: bytes, headers: dict[str, str], n: int) -> dict[str, float]:
    """Sequential hits over one connection: p50 and p99 latency, and the gateway's CPU per hit."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send() -> tuple[str, bytes]:
        connection.request("POST", path, body=raw, headers=headers)
        response = connection.getresponse()
        return response.getheader("x-detgate-cache"), response.read()

    first, _ = send()
    again, _ = send()
    assert again == "hit", (path, first, again)
    latencies = []
    cpu_before = cpu_seconds(pid)
    for _ in range(n):
        start = time.perf_counter()
        cache, _ = send()
        latencies.append(time.perf_counter() - start)
        assert cache == "hit", cache
    cpu = cpu_seconds(pid) - cpu_before
    connection.close()
    latencies.sort()
    return {"p50_ms": latencies[len(latencies) // 2] * 1e3, "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
            "cpu_us_per_hit": cpu / n * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description="coding-agent requests on the hit path")
    parser.add_argument("--hits", type=int, default=200)
    parser.add_argument("--prepares", type=int, default=200)
    parser.add_argument("--out", default="agent_prepare", help="results file name, without extension")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "tests")))}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    ports = {name: free_port() for name in ("openai", "anthropic", "gateway")}
    procs = [subprocess.Popen([sys.executable, "tests/fakes/openai_upstream.py", "--port", str(ports["openai"]),
                               "--words", "30", "30"], cwd=REPO, env=env, **quiet),
             subprocess.Popen([sys.executable, "tests/fakes/anthropic_upstream.py", "--port", str(ports["anthropic"]),
                               "--words", "30", "30"], cwd=REPO, env=env, **quiet)]
    upstreams = [f"fake=http://127.0.0.1:{ports['openai']}/v1",
                 {"name": "claude", "url": f"http://127.0.0.1:{ports['anthropic']}/v1", "profile": "anthropic",
                  "api_key": "sk-op"}]
    body_cases = cases()
    try:
        prepared = prepare_times(upstreams, body_cases, args.prepares)
        flags = ["--upstream", upstreams[0], "--upstream", f"claude={upstreams[1]['url']}#anthropic"]
        gateway = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(ports["gateway"]),
                                    *flags, "--secret", SECRET], cwd=REPO, env=env, **quiet)
        procs.append(gateway)
        wait_http(f"http://127.0.0.1:{ports['gateway']}/healthz")
        rows = []
        for name, path, raw, headers in body_cases:
            hit = hit_times(ports["gateway"], gateway.pid, path, raw, headers, args.hits)
            tools = len(json.loads(raw).get("tools") or [])
            rows.append({"body": name, "bytes": len(raw), "tools": tools,
                         "prepare_us": round(prepared[name]), **{k: round(v, 3) for k, v in hit.items()}})
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)

    base = rows[0]
    for row in rows:
        row["cpu_vs_baseline"] = round(row["cpu_us_per_hit"] / base["cpu_us_per_hit"], 2)
    lines = ["| body | bytes | tools | prepare us (median) | hit p50 ms | hit p99 ms | gateway CPU us/hit "
             "| CPU vs baseline |", "|" + "---|" * 8]
    lines += [f"| {r['body']} | {r['bytes']} | {r['tools']} | {r['prepare_us']} | {r['p50_ms']:.2f} "
              f"| {r['p99_ms']:.2f} | {r['cpu_us_per_hit']:.0f} | {r['cpu_vs_baseline']:.2f} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"machine": machine, "hits": args.hits,
                                                          "prepares": args.prepares, "rows": rows}, indent=2) + "\n")
    (RESULTS / f"{args.out}.md").write_text(
        f"# Coding-agent requests on the hit path\n\n`python3 bench/agent_prepare.py --hits {args.hits} --prepares "
        f"{args.prepares} --out {args.out}` on {os.cpu_count()} CPUs ({platform.platform()}): sequential hits over "
        f"one keep-alive connection to a gateway with the in-process store; `prepare` timed alone in the bench "
        f"process. Bodies: the last POST of a real Claude Code and Codex run (tests/agents/fixtures), beside a small "
        f"chat body. A body of at most {PreparedMemo.MAX_BODY // 1024} KB repeated byte for byte is answered from "
        f"the prepared-request memo, so the chat and Codex hits skip `prepare`; the Claude Code body is larger and "
        f"is prepared on every hit, as every new turn of an agent is.\n\n{table}\n")


if __name__ == "__main__":
    main()
