"""Issue 40: a coding agent's session recorded through `detgate serve --mode record`, committed
as a golden file, replays in `--mode replay` with every request a hit: the same answer, the
same files written; on another day; with tool outputs that change on every run. The real
Claude Code and Codex CLIs, against a fake model that answers every call differently."""
from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import pytest
import redis

from agent_clis import REPO, SECRET, TRICKY, Workspace
from agent_kinds import AGENTS, CLAUDE, CODEX, Agent
from agent_scripts import HELLO, PROMPT

BY_NAME = {"ids": lambda agent: agent.name}


def _cache_column(gw) -> str:
    return "\n".join(f"  {line.get('status')} {line.get('path')} cache={line.get('cache')} "
                     f"{ {k: v for k, v in line.items() if k not in ('ts', 'level', 'logger', 'method', 'path', 'status', 'cache', 'key', 'tenant', 'ms', 'route', 'model')} }"
                     for line in gw.posts())


def _all_hits(gw, expected: int) -> None:
    posts = gw.posts()
    assert [line.get("cache") for line in posts] == ["hit"] * expected, (
        f"replay: {len(posts)} POSTs for {expected} recorded, not all hits:\n{_cache_column(gw)}")


def _golden_round_trip(redis_url: str, tmp_path) -> None:
    """What CI does: export the recording, start from an empty store, import the file."""
    golden = tmp_path / "agent-session.golden"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for action in ("export", "import"):
        if action == "import":
            redis.Redis.from_url(redis_url).flushall()
        done = subprocess.run([sys.executable, "-m", "gateway", "cache", action, str(golden), "--redis-url",
                               redis_url, "--secret", SECRET], env=env, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert golden.stat().st_size > 0


def _record(agent: Agent, fake, upstream: str, gateway, root, volatile: bool = False):
    space = Workspace.fresh(root)
    agent.arm(fake, space, volatile)
    recorder = gateway(upstream, "record")
    answer = agent.answer(agent.run(space, recorder.url, PROMPT))
    recorded = len(recorder.posts())
    recorder.__exit__(None, None, None)
    assert recorded == len(fake.posts(agent.path)) >= 4, "the tool loop did not run through the gateway"
    assert space.files()["hello.txt"] == HELLO.encode()
    return answer, space.files(), recorded


def _replays(agent: Agent, upstream: str, gateway, root, recorded: int, answer, files, **run_options):
    """The agent run again through a replaying gateway on a fresh workspace: every request must
    hit, and the answer and the files be the recording's. The replaying gateway, for more checks."""
    replayer = gateway(upstream, "replay")
    space = Workspace.fresh(root)
    done = agent.run(space, replayer.url, PROMPT, **run_options)
    _all_hits(replayer, recorded)
    assert agent.answer(done) == answer
    assert space.files() == files
    return replayer


@pytest.mark.parametrize("agent", AGENTS, **BY_NAME)
def test_second_run_replays_from_the_golden_file(agent, agent_clis, fake_agent, gateway, redis_url, tmp_path):
    fake, upstream = fake_agent
    answer, files, recorded = _record(agent, fake, upstream, gateway, tmp_path / "ws")
    _golden_round_trip(redis_url, tmp_path)
    calls = len(fake.posts(agent.path))

    _replays(agent, upstream, gateway, tmp_path / "ws", recorded, answer, files)
    assert len(fake.posts(agent.path)) == calls, "a replay called the upstream"


def test_claude_code_replays_a_day_later(agent_clis, fake_agent, gateway, tmp_path):
    if shutil.which("faketime") is None:
        pytest.fail("faketime is not installed: run scripts/setup.sh (make test does)")
    fake, upstream = fake_agent
    answer, files, recorded = _record(CLAUDE, fake, upstream, gateway, tmp_path / "ws")

    _replays(CLAUDE, upstream, gateway, tmp_path / "ws", recorded, answer, files, wrap=["faketime", "-f", "+1d"])


def test_codex_request_of_the_next_day_hits(agent_clis, fake_agent, gateway, tmp_path):
    """Codex is a static binary faketime cannot move: its first request, as it sends it
    (captured straight from the CLI), with `<current_date>` a day later, must hit."""
    fake, upstream = fake_agent
    _record(CODEX, fake, upstream, gateway, tmp_path / "ws")
    fake.requests.clear()
    space = Workspace.fresh(tmp_path / "ws")
    CODEX.answer(CODEX.run(space, upstream, PROMPT))  # straight to the fake: the CLI's own bytes
    sent = fake.posts("/v1/responses")[0]
    today = re.search(rb"<current_date>(\d{4}-\d{2}-\d{2})</current_date>", sent.body)
    assert today, "Codex no longer sends <current_date>"
    tomorrow = (datetime.date.fromisoformat(today[1].decode()) + datetime.timedelta(days=1)).isoformat().encode()
    moved = sent.body.replace(today[0], b"<current_date>" + tomorrow + b"</current_date>")
    assert moved != sent.body

    replayer = gateway(upstream, "replay")
    headers = {k: v for k, v in sent.headers.items() if k not in ("host", "content-length", "accept-encoding")}
    for body in (sent.body, moved):  # another run's ids, then also another day
        request = urllib.request.Request(replayer.url + "/v1/responses", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, cache, text = response.status, response.headers.get("x-detgate-cache"), response.read()
        except urllib.error.HTTPError as error:
            status, cache, text = error.code, error.headers.get("x-detgate-cache"), error.read()
        assert (status, cache) == (200, "hit"), f"{status} {cache}: {text[:600]!r}"


@pytest.mark.parametrize("agent", AGENTS, **BY_NAME)
def test_session_replays_when_a_tool_output_changes(agent, agent_clis, fake_agent, gateway, tmp_path):
    """The second command prints the time in nanoseconds: no two runs send the same tool output,
    so only a session replay (turn N of the recording, tool outputs aside) can answer."""
    fake, upstream = fake_agent
    answer, files, recorded = _record(agent, fake, upstream, gateway, tmp_path / "ws", volatile=True)

    replayer = _replays(agent, upstream, gateway, tmp_path / "ws", recorded, answer, files)
    # The turns after the changed output warn, in the access log too, that a tool output differed.
    later = replayer.posts()[2:]
    assert all("tool" in (line.get("warnings") or "").lower() for line in later), (
        f"no warning naming the changed tool output:\n{_cache_column(replayer)}")


@pytest.mark.parametrize("agent", AGENTS, **BY_NAME)
def test_file_bytes_reach_the_upstream_unchanged(agent, agent_clis, fake_agent, gateway, tmp_path):
    """data.txt (a BOM, CRLF, U+200B, a decomposed e-acute) shown by the agent reaches the
    model through the gateway exactly as the CLI sends it straight to the model."""
    fake, upstream = fake_agent
    space = Workspace.fresh(tmp_path / "ws")
    agent.arm(fake, space)
    agent.answer(agent.run(space, upstream, PROMPT))
    direct = agent.tool_outputs(fake.posts(agent.path)[-1].json())[-1]
    assert "\u200b" in direct and "e\u0301" in direct, f"the CLI itself changed the file: {direct!r}"
    # As on disk: Codex passes the output on whole; Claude Code's Bash drops its final line end.
    assert direct == (TRICKY.decode() if agent is CODEX else TRICKY.decode().rstrip("\r\n")), direct

    fake.requests.clear()
    space = Workspace.fresh(tmp_path / "ws")
    agent.arm(fake, space)
    agent.answer(agent.run(space, gateway(upstream, "record").url, PROMPT))
    through = agent.tool_outputs(fake.posts(agent.path)[-1].json())[-1]
    assert through == direct


@pytest.mark.parametrize("agent", AGENTS, **BY_NAME)
def test_a_replay_miss_explains_itself(agent, agent_clis, fake_agent, gateway, tmp_path):
    """A prompt that was not recorded: the agent shows the user the gateway's 400, naming the
    nearest recording and where it differs, not a model error (Claude Code says "There's an
    issue with the selected model" on a 404)."""
    fake, upstream = fake_agent
    _record(agent, fake, upstream, gateway, tmp_path / "ws")
    replayer = gateway(upstream, "replay")
    done = agent.run(Workspace.fresh(tmp_path / "ws"), replayer.url, PROMPT + " Then stop.")
    shown = done.stdout + done.stderr
    assert done.returncode != 0
    assert [line.get("status") for line in replayer.posts()] == [400], _cache_column(replayer)
    assert "nearest" in shown and "selected model" not in shown, shown[-3000:]
