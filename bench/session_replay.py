"""Session replay benchmark: what a replayed agent turn costs when its tool outputs changed
(found by its masked key and checked against the recorded turn), beside the exact hit of the
same turn, and what a replay miss costs while it searches the nearest recording, with
Claude-Code-sized requests (a 60 KB system prompt) on a real Redis.

One run starts a fake Anthropic upstream, redis-server and two in-process gateways (record,
replay), records SESSIONS tool loops of TURNS turns each, then times, one request at a time
over a kept-alive connection: the exact hit of each recorded turn, the same turns with every
tool output changed (session hits), and misses (the prompt changed) that compare against
every recorded turn. Prints a table and writes bench/results/session_replay.json and .md.

    python3 bench/session_replay.py [--sessions 10] [--turns 8] [--rounds 5]

Needs `redis-server` on PATH.
"""
from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fakes.anthropic_upstream import FakeAnthropic  # noqa: E402  (test tooling, found via the path above)
from fakes.loopback import LoopbackServer  # noqa: E402
from redis_process import RedisProcess  # noqa: E402

from gateway.app import create_app  # noqa: E402
from gateway.config import Settings  # noqa: E402

RESULTS = REPO / "bench" / "results"
MODEL = "claude-sonnet-4-6"
SYSTEM = " ".join(f"Rule {i}: keep the workspace tidy and explain each step." for i in range(1100))  # ~60 KB
SHELL = {"name": "shell", "description": "Run a command.",
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
HEADERS = {"content-type": "application/json", "x-api-key": "unused", "anthropic-version": "2023-06-01"}


class Client:
    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def post(self, body: dict, session: str) -> tuple[float, int, dict, bytes]:
        data = orjson.dumps(body)
        started = time.perf_counter()
        self.conn.request("POST", "/v1/messages", data, {**HEADERS, "x-claude-code-session-id": session})
        response = self.conn.getresponse()
        payload = response.read()
        return time.perf_counter() - started, response.status, dict(response.getheaders()), payload


def loop(client: Client, session: str, prompt: str, turns: int, output: str) -> list[tuple[float, int, dict, dict]]:
    """One agent run: `turns` requests, each a tool use answered with `output`; (seconds,
    status, headers, body sent) per request."""
    messages, out = [{"role": "user", "content": prompt}], []
    for turn in range(turns):
        body = {"model": MODEL, "max_tokens": 64, "system": SYSTEM, "messages": messages, "tools": [SHELL],
                "tool_choice": {"type": "any"}}
        seconds, status, headers, payload = client.post(body, session)
        out.append((seconds, status, headers, body))
        if status != 200:
            break
        content = orjson.loads(payload)["content"]
        use = next(b for b in content if b["type"] == "tool_use")
        messages = messages + [{"role": "assistant", "content": content},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                             "content": f"{output} turn {turn}"}]}]
    return out


def ms(values: list[float]) -> dict:
    values = sorted(values)
    return {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 2),
            "p90_ms": round(values[int(len(values) * 0.9) - 1] * 1000, 2), "mean_ms": round(statistics.mean(values) * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    redis = RedisProcess(Path(tempfile.mkdtemp())).start()
    fake = FakeAnthropic()
    try:
        with LoopbackServer(fake.app()) as upstream:
            shared = {"upstreams": [{"name": "claude", "url": upstream.url + "/v1", "profile": "anthropic",
                                     "api_key": "sk-op"}],
                      "secret": "bench-secret-0123456789", "log_level": "WARNING", "redis_url": redis.url,
                      "near_cache_ttl_s": 0}
            with LoopbackServer(create_app(Settings.model_validate({**shared, "mode": "record"}))) as recorder, \
                 LoopbackServer(create_app(Settings.model_validate({**shared, "mode": "replay"}))) as replayer:
                recording = Client(recorder.url)
                record = [r for s in range(args.sessions)
                          for r in loop(recording, f"rec-{s}", f"Task {s}: list the files.", args.turns, "Nov 28 13:56")]
                assert all(status == 200 for _, status, _, _ in record)
                replaying = Client(replayer.url)
                exact, session, miss = [], [], []
                for round_ in range(args.rounds):
                    for s in range(args.sessions):
                        for kind, output, out in (("exact", "Nov 28 13:56", exact), ("session", f"Nov 29 0{round_}:12", session)):
                            run = loop(replaying, f"replay-{round_}-{s}-{kind}", f"Task {s}: list the files.",
                                       args.turns, output)
                            assert [h.get("x-detgate-cache") for _, _, h, _ in run] == ["hit"] * args.turns, kind
                            # turn 0 has no tool output: an exact hit in both runs
                            out += [seconds for seconds, _, _, _ in (run if kind == "exact" else run[1:])]
                    for turn in range(args.rounds):
                        seconds, status, _, _ = replaying.post(
                            {"model": MODEL, "max_tokens": 64, "system": SYSTEM, "tools": [SHELL],
                             "tool_choice": {"type": "any"},
                             "messages": [{"role": "user", "content": f"Task {turn}: delete the files."}]}, "miss")
                        assert status == 400
                        miss.append(seconds)
    finally:
        redis.stop()
    body_kb = round(len(orjson.dumps(record[-1][3])) / 1024, 1)
    rows = {"exact hit (baseline)": ms(exact), "session hit, tool outputs changed": ms(session),
            f"replay miss, nearest of {len(record)} recorded turns": ms(miss)}
    result = {"sessions": args.sessions, "turns": args.turns, "rounds": args.rounds, "largest_body_kb": body_kb,
              "python": platform.python_version(), "machine": platform.machine(), "rows": rows}
    lines = [f"# Session replay: {args.sessions} sessions x {args.turns} turns recorded, requests up to {body_kb} KB, "
             "one real Redis on loopback", "",
             "| request | n | p50 ms | p90 ms | mean ms |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {r['n']} | {r['p50_ms']} | {r['p90_ms']} | {r['mean_ms']} |" for name, r in rows.items()]
    table = "\n".join(lines) + "\n"
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "session_replay.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "session_replay.md").write_text(table + "\n`python3 bench/session_replay.py` "
                                               f"--sessions {args.sessions} --turns {args.turns} --rounds {args.rounds}\n")


if __name__ == "__main__":
    main()
