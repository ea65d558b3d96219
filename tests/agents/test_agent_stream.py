"""Issue 40: a streamed request with tools streams live through the gateway. Claude Code (its
request always carries its tools) against a model that spreads its answer over 30 s, with an
upstream idle timeout of 5 s: the first text reaches the CLI long before the model is done,
the run succeeds, and the answer, stored once complete, replays."""
from __future__ import annotations

import subprocess
import time

import orjson

from agent_clis import Workspace, claude_command
from agent_kinds import CLAUDE, CODEX
from agent_scripts import PROMPT

PACE_S = 30.0


def test_claude_code_streams_live_from_a_slow_model(agent_clis, fake_agent, gateway, tmp_path):
    fake, upstream = fake_agent
    fake.pace_s = PACE_S  # no script: one turn, answered with text spread over 30 s
    recorder = gateway(upstream, "record", "--upstream-idle-timeout-s", "5")
    space = Workspace.fresh(tmp_path / "ws")
    argv, env = claude_command(space, recorder.url, PROMPT, output="stream-json")
    started = time.monotonic()
    first_text = None
    lines = []
    with subprocess.Popen(argv, cwd=space.project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        for line in process.stdout:
            lines.append(line)
            if first_text is None and '"text_delta"' in line:
                first_text = time.monotonic() - started
        process.wait(timeout=120)
        errors = process.stderr.read()
    took = time.monotonic() - started
    result = orjson.loads(lines[-1]) if lines else {}
    assert process.returncode == 0 and not result.get("is_error"), f"{result}\n{errors[-2000:]}"
    assert took >= PACE_S * 0.9, f"the model's answer took {took:.1f} s, not the {PACE_S} s it was paced over"
    # Straight to the fake, Claude Code shows its first text about 6 s into a 33 s run.
    assert first_text is not None and first_text < took - PACE_S / 2, (
        f"first text after {first_text} s of a {took:.1f} s run: the stream was buffered")
    recorder.__exit__(None, None, None)

    fake.pace_s = 0.0
    replayer = gateway(upstream, "replay")
    space = Workspace.fresh(tmp_path / "ws")
    done = CLAUDE.run(space, replayer.url, PROMPT)
    assert [line.get("cache") for line in replayer.posts()] == ["hit"]
    assert CLAUDE.answer(done) == result["result"]


def test_codex_finishes_a_turn_slower_than_the_idle_timeout(agent_clis, fake_agent, gateway, tmp_path):
    """Codex prints nothing until a turn is done, so its first byte cannot be timed from
    outside; what it shows is that a turn longer than the idle timeout (12 s against 5 s, its
    events never more than half a second apart) is not cut off, and replays once stored."""
    fake, upstream = fake_agent
    fake.pace_s = 12.0
    recorder = gateway(upstream, "record", "--upstream-idle-timeout-s", "5")
    started = time.monotonic()
    answer = CODEX.answer(CODEX.run(Workspace.fresh(tmp_path / "ws"), recorder.url, PROMPT))
    assert time.monotonic() - started >= 12.0
    recorder.__exit__(None, None, None)

    fake.pace_s = 0.0
    replayer = gateway(upstream, "replay")
    done = CODEX.run(Workspace.fresh(tmp_path / "ws"), replayer.url, PROMPT)
    assert [line.get("cache") for line in replayer.posts()] == ["hit"]
    assert CODEX.answer(done) == answer
