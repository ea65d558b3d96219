"""Fixtures shared by every test package: a real redis-server."""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from fakes.loopback import free_port


class RedisServer:
    """A real redis-server on a free loopback port, without persistence."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run scripts/setup.sh (make test does)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        import redis  # lazily: the GPU image that runs the kernel tests has no redis client

        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        self.stop()
                        pytest.fail(f"redis-server did not come up on port {self.port}")
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server():
    """The session's redis-server; its URL."""
    server = RedisServer()
    yield server.url
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """The session's Redis, emptied before each test."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    return redis_server


@pytest.fixture
def own_redis():
    """A private redis-server for one test (which may stop it to simulate an outage)."""
    server = RedisServer()
    yield server
    server.stop()
