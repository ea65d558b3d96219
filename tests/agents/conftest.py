"""Agent fixtures: the real CLIs from npm, the fake agent upstream, and `detgate serve` as a
process in record or replay mode, whose access log says what each request was."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from agent_clis import REPO, SECRET, install, installed
from fakes.agent_upstream import FakeAgentUpstream
from fakes.loopback import LoopbackServer, free_port
from npm_install import ensure_installed
from serve_process import wait_healthy


@pytest.fixture(scope="session")
def agent_clis() -> None:
    """The pinned Claude Code and Codex CLIs in build/agents, installed from npm when missing."""
    ensure_installed("the agent CLIs (Claude Code, Codex)", installed, install)


@pytest.fixture
def fake_agent():
    """The scripted agent upstream (scripts set per test) and its base URL, without /v1."""
    fake = FakeAgentUpstream()
    with LoopbackServer(fake.app()) as server:
        yield fake, server.url


class Gateway:
    """`detgate serve` over the checkout, in front of one upstream, on the test's Redis."""

    def __init__(self, upstream: str, redis_url: str, mode: str, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.argv = [sys.executable, "-m", "gateway", "serve", "--port", str(self.port),
                     # One fake speaks both wires: OpenAI's (Codex, the SDK) and, as an
                     # `anthropic` profile upstream, Anthropic's (Claude Code).
                     "--upstream", f"fake={upstream}/v1", "--upstream", f"claude={upstream}/v1#anthropic",
                     # No tenants, no passthrough: as docs/agents.md sets it up, the agents'
                     # own keys are placeholders and the entries everyone's.
                     "--redis-url", redis_url,
                     "--secret", SECRET, "--mode", mode, "--log-level", "INFO", *extra]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Gateway:
        with open(self.log, "wb") as stderr:
            self.process = subprocess.Popen(self.argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                            stdout=subprocess.DEVNULL, stderr=stderr)
        wait_healthy(self.process, self.url, 30, lambda: self.log.read_text()[-2000:])
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def access(self) -> list[dict]:
        """The access log lines so far (flushed within a quarter second of each request)."""
        time.sleep(0.4)
        lines = []
        for raw in self.log.read_bytes().splitlines():
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(line, dict) and line.get("logger") == "detgate.access":
                lines.append(line)
        return lines

    def posts(self) -> list[dict]:
        return [line for line in self.access() if line.get("method") == "POST"]


@pytest.fixture
def gateway(redis_url, tmp_path):
    """Starts a gateway: gateway(upstream_url, mode, *extra flags), on the test's (emptied) Redis."""
    started: list[Gateway] = []

    def start(upstream: str, mode: str, *extra: str) -> Gateway:
        gw = Gateway(upstream, redis_url, mode, tmp_path / f"gateway-{len(started)}-{mode}.log", *extra).__enter__()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        if gw.process.poll() is None:
            gw.__exit__(None, None, None)
