"""Key rules benchmark: what preparing a coding agent's request costs (parse, validate,
canonicalize, sign) with its built-in key rules applied (record/replay modes) beside the same
request without them (normal mode, the baseline), and what the hidden-variable scan of the
whole keyed body costs on a miss (a first turn, and a later one whose long texts, the system
prompt and tools, were scanned before), for Claude Code and Codex requests of real size.

The key rules' own cost is timed beside the canonical form they run after (the baseline);
the whole preparation is timed too, with and without them (for Claude Code it is mostly the
JSON Schema check of its tools' schemas, done on every request, not the rules).

Bodies are shaped like the captured ones (tests/gateway/agent_bodies.py), padded to the size
the real CLIs send (Claude Code ~77 KB: 24 tools and a long system prompt; Codex ~63 KB: a
long developer prompt and a tool namespace), each with a tool output. Each timing is the
median of ROUNDS runs of one preparation, in one process, nothing else running.

    python3 bench/key_rules.py [--rounds 200]

Prints a table and writes bench/results/key_rules.json and .md.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gateway"))
sys.path.insert(0, str(REPO / "bench"))

from agent_bodies import (  # noqa: E402  (test tooling, found via the path above)
    CLAUDE_UA,
    CODEX_UA,
    DATA,
    TODAY,
    claude_request,
    codex_request,
    codex_run,
)
from md_table import markdown_table  # noqa: E402

from gateway.apis import SURFACES  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.ingress.auth import Tenants  # noqa: E402
from gateway.policy import hidden_vars  # noqa: E402
from gateway.policy.key_rules import apply, recognise  # noqa: E402
from gateway.policy.prepare import Asked, prepare  # noqa: E402

RESULTS = REPO / "bench" / "results"
SECRET = b"bench-secret"
# Prose of the length real agents send, with the digits and dates real prompts hold.
PROSE = ("Use the Read tool for files; run tests with `make test` (timeout 120000 ms, max 600000). "
         "Never commit secrets; on 2024-03-01 the policy changed, see docs/policy.md section 4.2. ")


def _claude() -> tuple[str, dict, bytes]:
    request = claude_request(TODAY, "3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70", DATA)
    tools = [{"name": f"Tool{i}", "description": PROSE * 14,
              "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}}} for i in range(24)]
    body = {k: v for k, v in request.items() if k not in ("betas", "extra_body")} | request["extra_body"]
    body["system"][1]["text"] += "\n" + PROSE * 160
    body["tools"] = body["tools"] + tools
    return "messages", {"user-agent": CLAUDE_UA}, orjson.dumps({**body, "stream": True})


def _codex() -> tuple[str, dict, bytes]:
    request = codex_request(TODAY, codex_run(), "0.1", DATA)
    body = {k: v for k, v in request.items() if k not in ("extra_body", "extra_headers")} | request["extra_body"]
    body["model"] = "fake/gpt-6.2-sol"
    body["input"][0]["tools"][0]["tools"][0]["description"] += PROSE * 150
    body["input"][1]["content"][0]["text"] += "\n" + PROSE * 320
    return "responses", {"user-agent": CODEX_UA}, orjson.dumps({**body, "stream": True})


def _median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    upstreams = ["fake=http://127.0.0.1:9/v1", {"name": "claude", "url": "http://127.0.0.1:9/v1", "profile": "anthropic",
                                                "api_key": "k"}]
    settings = {mode: Settings.model_validate({"upstreams": upstreams, "secret": "s", "mode": mode})
                for mode in ("normal", "record")}
    rows = []
    for agent, (route, headers, raw) in (("claude-code", _claude()), ("codex", _codex())):
        surface = SURFACES[route]
        asked = Asked(agent=recognise(headers["user-agent"]))
        prepared = {mode: prepare(surface, raw, asked, s, Tenants(()), SECRET) for mode, s in settings.items()}
        assert prepared["normal"].key != prepared["record"].key  # the rules fired, so the keys differ

        def miss_scan(cold: bool) -> None:
            if cold:  # the agent's first turn: nothing of it seen before
                hidden_vars._MEMO.clear()
            call = prepared["record"].call
            keyed, _ = apply(surface.canonical(call.body, True).key, prepared["record"].applicable)
            hidden_vars.scan(keyed, time.time(), surface.resent)

        body = orjson.loads(raw)
        canonical = surface.canonical(body, True)
        rules = prepared["record"].applicable
        form = _median_ms(lambda: surface.canonical(body, True), args.rounds)
        applied = _median_ms(lambda: apply(canonical.key, rules), args.rounds)
        off = _median_ms(lambda: prepare(surface, raw, asked, settings["normal"], Tenants(()), SECRET), args.rounds)
        on = _median_ms(lambda: prepare(surface, raw, asked, settings["record"], Tenants(()), SECRET), args.rounds)
        rows.append({"agent": agent, "body KB": round(len(raw) / 1024, 1), "canonical form (ms)": form,
                     "key rules (ms)": applied, "rules / form": f"{applied / form:.2f}x",
                     "prepare, no rules (ms)": off, "prepare, agent rules (ms)": on,
                     "rules fired": ", ".join(w.split(": ", 1)[1] for w in prepared["record"].warnings
                                              if w.startswith("key rules")),
                     "miss scan, first turn (ms)": _median_ms(lambda: miss_scan(True), max(args.rounds // 4, 10)),
                     "miss scan, later turn (ms)": _median_ms(lambda: miss_scan(False), args.rounds)})
    meta = {"python": platform.python_version(), "machine": platform.machine(), "rounds": args.rounds,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    table = markdown_table(rows)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "key_rules.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / "key_rules.md").write_text(
        "# Key rules: preparing an agent's request with and without its built-in rules\n\n"
        f"`python3 bench/key_rules.py --rounds {args.rounds}` ({meta['when']}, Python {meta['python']}, "
        f"{meta['machine']}; medians; the machine's 2 cores shared with other work).\n\n{table}\n")


if __name__ == "__main__":
    main()
