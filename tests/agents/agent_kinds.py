"""The two CLIs side by side: how each runs, what its fake model scripts, where its answer and
its tool outputs are, so the replay tests can be written once for both."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Callable

import orjson

from agent_clis import Workspace, run_claude, run_codex
from agent_scripts import claude_script, codex_script
from fakes.agent_upstream import FakeAgentUpstream


@dataclass(frozen=True)
class Agent:
    name: str
    path: str  # the endpoint its turns go to
    run: Callable[..., subprocess.CompletedProcess]
    script: Callable[..., list]

    def arm(self, fake: FakeAgentUpstream, space: Workspace, volatile: bool = False) -> None:
        """Give the fake this agent's tool loop for `space`."""
        if self.name == "claude":
            fake.anthropic_script = self.script(space.project, volatile)
        else:
            fake.responses_script = self.script(space.project, volatile)

    def answer(self, done: subprocess.CompletedProcess) -> str:
        """The final answer the CLI printed."""
        assert done.returncode == 0, f"{self.name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if self.name == "claude":
            result = orjson.loads(done.stdout)
            assert not result.get("is_error"), result
            return result["result"]
        return done.stdout.strip()

    def tool_outputs(self, body: dict) -> list[str]:
        """What each command printed, in order (Codex puts a `Wall time` line, which varies,
        in a part of its own before it)."""
        if self.name == "claude":
            return [_text(block.get("content")) for message in body.get("messages") or ()
                    if isinstance(message.get("content"), list)
                    for block in message["content"] if block.get("type") == "tool_result"]
        return [_text(item.get("output")[-1:] if isinstance(item.get("output"), list) else item.get("output"))
                for item in body.get("input") or ()
                if item.get("type") in ("function_call_output", "custom_tool_call_output")]


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or () if isinstance(part, dict))


CLAUDE = Agent("claude", "/v1/messages", run_claude, claude_script)
CODEX = Agent("codex", "/v1/responses", run_codex, codex_script)
AGENTS = [CLAUDE, CODEX]
