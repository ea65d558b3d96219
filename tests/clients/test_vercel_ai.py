"""The Vercel AI SDK (`ai` generateText/streamText with @ai-sdk/openai chat and responses models
and @ai-sdk/anthropic), run by tests/clients/node/vercel_ai.mjs, with and without a tool: a first
call misses, the same call again hits with the same text and tool calls."""
from __future__ import annotations

import pytest

from matrix import CLAUDE_MODEL, OPENAI_MODEL, node, node_twice, twice

PROVIDERS = {"chat": ("openai-chat", OPENAI_MODEL), "responses": ("openai-responses", OPENAI_MODEL),
             "messages": ("anthropic", CLAUDE_MODEL)}


@pytest.mark.parametrize("tool", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", list(PROVIDERS))
def test_vercel_ai(gw, node_clients, surface, stream, tool):
    provider, model = PROVIDERS[surface]
    ask = {"base": gw.url, "provider": provider, "model": model, "stream": stream, "tool": tool,
           "prompt": f"vercel-ai {surface} stream={stream} tool={tool}: find the install guide."}

    first = node_twice(gw, "vercel_ai.mjs", ask, stream)
    assert bool(first.result["tool_calls"]) == tool


@pytest.mark.parametrize("stream", [False, True])
def test_vercel_ai_structured(gw, node_clients, stream):
    """Output.object on the responses model: a strict JSON schema in text.format."""
    ask = {"base": gw.url, "provider": "openai-responses", "model": OPENAI_MODEL, "stream": stream, "tool": False,
           "structured": True, "prompt": f"vercel-ai structured stream={stream}: find the install guide."}
    first = node_twice(gw, "vercel_ai.mjs", ask, stream)
    assert set(first.result["output"]) == {"query", "limit"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", list(PROVIDERS))
def test_vercel_ai_tool_loop(gw, node_clients, surface, stream):
    """A tool the SDK executes, then its result sent back (stopWhen stepCountIs(2)): two requests,
    the second holding the first's tool call and the tool's output, both hits the second time."""
    provider, model = PROVIDERS[surface]
    ask = {"base": gw.url, "provider": provider, "model": model, "stream": stream, "tool": True, "loop": True,
           "prompt": f"vercel-ai loop {surface} stream={stream}: find the install guide."}

    def call() -> dict:
        out = node("vercel_ai.mjs", ask)
        out.pop("cache")  # the last step's; the gateway's notes check every request
        return out

    first, _ = twice(gw, call, stream)
    assert len(first.requests) == 2 and first.result["tool_calls"]
