"""The anthropic Python client on Messages, plain and streamed, with and without a tool: a first
call misses, the same call again hits with what the app saw."""
from __future__ import annotations

import anthropic
import pytest

from matrix import CLAUDE_MODEL, SEARCH_DESCRIPTION, SEARCH_SCHEMA, twice

TOOL = {"name": "search", "description": SEARCH_DESCRIPTION, "input_schema": SEARCH_SCHEMA}


def _messages(base: str, stream: bool, tool: bool) -> dict:
    api = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    ask = {"model": CLAUDE_MODEL, "max_tokens": 64,
           "messages": [{"role": "user", "content": f"anthropic stream={stream} tool={tool}: find the install guide."}]}
    if tool:
        ask |= {"tools": [TOOL], "tool_choice": {"type": "any"}}
    if stream:
        with api.messages.stream(**ask) as events:
            text = "".join(events.text_stream)
            message = events.get_final_message()
    else:
        message = api.messages.create(**ask)
        text = "".join(b.text for b in message.content if b.type == "text")
    calls = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    return {"text": text, "tool_calls": calls, "id": message.id, "stop": message.stop_reason}


@pytest.mark.parametrize("tool", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_python(gw, stream, tool):
    first, _ = twice(gw, lambda: _messages(gw.url, stream, tool), stream)
    assert bool(first.result["tool_calls"]) == tool
