"""The SDK matrix's fixtures: one gateway per module, in this process on real Redis, in front
of the nondeterministic fake OpenAI (chat completions and Responses) and Anthropic providers,
and the pinned npm clients in build/clients."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import redis

from fakes.anthropic_upstream import FakeAnthropic
from fakes.loopback import LoopbackServer
from fakes.openai_upstream import FakeUpstream
from matrix import Gateway, NODE_PREFIX, install_node, node_installed


@pytest.fixture(scope="module")
def gw(redis_server):
    """The module's gateway over the two fakes, on the session's Redis emptied first."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    openai_fake, claude_fake = FakeUpstream(), FakeAnthropic()
    with LoopbackServer(openai_fake.app()) as openai_up, LoopbackServer(claude_fake.app()) as claude_up:
        with Gateway(redis_server, openai_fake, openai_up.url + "/v1", claude_fake, claude_up.url + "/v1") as gateway:
            yield gateway


def _registry_reachable() -> bool:
    try:
        return subprocess.run(["npm", "ping"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def node_clients() -> str:
    """The pinned npm clients (openai, ai, @ai-sdk/*), installed into build/clients when missing;
    the folder the .mjs scripts run from."""
    if not node_installed():
        if shutil.which("npm") is None:
            pytest.fail("npm is not installed: run scripts/setup.sh (make test does)")
        done = install_node()
        if done.returncode != 0 and not _registry_reachable():
            pytest.skip("the npm registry is unreachable, so the Node clients (openai, the Vercel AI SDK) "
                        f"cannot be installed: {done.stderr.strip()[-300:]}")
        assert done.returncode == 0 and node_installed(), f"npm install of the Node clients failed:\n{done.stderr[-2000:]}"
    return str(NODE_PREFIX)
