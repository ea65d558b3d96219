"""Fixtures shared by every test package: a real redis-server."""
from __future__ import annotations

import shutil

import pytest

from redis_process import RedisProcess

# The gateway tests' shared assert helpers (imported first by tests/gateway/conftest.py)
# report failures like assertions written in the tests themselves.
pytest.register_assert_rewrite("gw_http")


def start_redis(directory) -> RedisProcess:
    """A real redis-server on a free loopback port, without persistence."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run scripts/setup.sh (make test does)")
    return RedisProcess(directory).start()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """The session's redis-server; its URL."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """The session's Redis, emptied before each test."""
    import redis  # lazily: the GPU image that runs the kernel tests has no redis client

    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    return redis_server


@pytest.fixture
def own_redis(tmp_path_factory):
    """A private redis-server for one test (which may stop it to simulate an outage)."""
    server = start_redis(tmp_path_factory.mktemp("own-redis"))
    yield server
    server.stop()
