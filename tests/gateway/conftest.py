"""Gateway fixtures: a fake upstream, gateways in-process (a thread) or as `detgate serve` processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fakes.anthropic_upstream import FakeAnthropic
from fakes.loopback import LoopbackServer, free_port
from fakes.openai_upstream import FakeUpstream
from gateway.app import create_app
from gateway.config import Settings
from gw_http import REPO, SECRET
from redis_cluster import RedisCluster
from serve_process import wait_healthy


@pytest.fixture(scope="session")
def upstream_server():
    fake = FakeUpstream()
    with LoopbackServer(fake.app()) as server:
        yield fake, server


@pytest.fixture
def upstream(upstream_server):
    """The fake provider, reset: (fake, base URL ending in /v1)."""
    fake, server = upstream_server
    fake.reset()
    return fake, server.url + "/v1"


@pytest.fixture(scope="session")
def anthropic_server():
    fake = FakeAnthropic()
    with LoopbackServer(fake.app()) as server:
        yield fake, server


@pytest.fixture
def claude(anthropic_server):
    """The fake Anthropic provider, reset: (fake, base URL ending in /v1)."""
    fake, server = anthropic_server
    fake.reset()
    return fake, server.url + "/v1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A real 3-master Redis Cluster, one per test module that asks for it."""
    with RedisCluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture
def gateway(upstream):
    """Start gateways in this process, each on its own loop thread; yields a factory
    gateway(**settings) -> LoopbackServer (its .url and .app for metrics/state)."""
    started = []

    def start(**overrides) -> LoopbackServer:
        values = {"upstreams": [f"fake={upstream[1]}"], "secret": SECRET, "log_level": "WARNING", **overrides}
        server = LoopbackServer(create_app(Settings.model_validate(values))).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


class GatewayProcess:
    """A real `detgate serve` process."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.process: subprocess.Popen | None = None

    def start(self) -> GatewayProcess:
        self.process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(self.port),
                                         "--log-level", "WARNING", *self.args],
                                        env=self.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_healthy(self.process, self.url, 20, lambda: self.process.stderr.read().decode())
        return self

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to release anything."""
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def gateway_process():
    started: list[GatewayProcess] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> GatewayProcess:
        proc = GatewayProcess(args, env).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
