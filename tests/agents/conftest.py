"""Agent fixtures: the real CLIs from npm, the fake agent upstream, and `detgate serve` as a
process in record or replay mode, whose access log says what each request was."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from agent_clis import REPO, SECRET, install, installed
from fakes.agent_upstream import FakeAgentUpstream
from fakes.loopback import LoopbackServer, free_port


def _registry_reachable() -> bool:
    try:
        return subprocess.run(["npm", "ping"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def agent_clis() -> None:
    """The pinned Claude Code and Codex CLIs in build/agents, installed from npm when missing."""
    if installed():
        return
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed: run scripts/setup.sh (make test does)")
    done = install()
    if done.returncode != 0 and not _registry_reachable():
        pytest.skip("the npm registry is unreachable, so the real agent CLIs cannot be installed: "
                    f"{done.stderr.strip()[-300:]}")
    assert done.returncode == 0 and installed(), f"npm install of the agent CLIs failed:\n{done.stderr[-2000:]}"


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
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"detgate serve exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("detgate serve did not become healthy")

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
