"""Capture what Claude Code and Codex send: each CLI run twice against the recording fake.

python tests/agents/capture.py OUT_DIR  (the CLIs installed in build/agents, as the suite does)
Writes OUT_DIR/{claude,codex}-run{1,2}.jsonl, one recorded request a line.
"""
from __future__ import annotations

import sys
from pathlib import Path

import orjson

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from agent_clis import Workspace, run_claude, run_codex  # noqa: E402
from agent_scripts import PROMPT, claude_script, codex_script  # noqa: E402
from fakes.agent_upstream import FakeAgentUpstream  # noqa: E402
from fakes.loopback import LoopbackServer  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:] or ("claude", "codex"):
        for run in (1, 2):
            space = Workspace.fresh(out / "ws" / name)
            fake = FakeAgentUpstream(anthropic_script=claude_script(space.project, volatile=True),
                                     responses_script=codex_script(space.project, volatile=True))
            with LoopbackServer(fake.app()) as server:
                runner = run_claude if name == "claude" else run_codex
                result = runner(space, server.url, PROMPT)
            print(name, run, result.returncode, result.stdout[-300:], result.stderr[-600:])
            (out / f"{name}-run{run}.jsonl").write_bytes(b"".join(orjson.dumps(r.row()) + b"\n" for r in fake.requests))


if __name__ == "__main__":
    main()
