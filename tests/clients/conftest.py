"""The SDK matrix's fixtures: one gateway per module, in this process on real Redis, in front
of the nondeterministic fake OpenAI (chat completions and Responses) and Anthropic providers,
and the pinned npm clients in build/clients."""
from __future__ import annotations

import pytest
import redis

from fakes.anthropic_upstream import FakeAnthropic
from fakes.loopback import LoopbackServer
from fakes.openai_upstream import FakeUpstream
from matrix import Gateway, NODE_PREFIX, install_node, node_installed
from npm_install import ensure_installed


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


@pytest.fixture(scope="session")
def node_clients() -> str:
    """The pinned npm clients (openai, ai, @ai-sdk/*), installed into build/clients when missing;
    the folder the .mjs scripts run from."""
    ensure_installed("the Node clients (openai, the Vercel AI SDK)", node_installed, install_node)
    return str(NODE_PREFIX)
