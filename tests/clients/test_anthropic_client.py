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


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_python_tool_loop(gw, stream):
    """The app runs the tool and sends its result back: the second request holds the first's
    tool_use block and a tool_result, and hits like the first."""
    api = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    prompt = [{"role": "user", "content": f"anthropic loop stream={stream}: find the install guide."}]

    def ask(**kwargs):
        if not stream:
            return api.messages.create(model=CLAUDE_MODEL, max_tokens=64, tools=[TOOL], **kwargs)
        with api.messages.stream(model=CLAUDE_MODEL, max_tokens=64, tools=[TOOL], **kwargs) as events:
            return events.get_final_message()

    def call() -> dict:
        first = ask(messages=prompt, tool_choice={"type": "any"})
        use = next(b for b in first.content if b.type == "tool_use")
        result = {"type": "tool_result", "tool_use_id": use.id, "content": f"{use.input['limit']} pages\r\nfound"}
        second = ask(messages=[*prompt, {"role": "assistant", "content": first.content},
                               {"role": "user", "content": [result]}])
        return {"call": (use.id, use.input), "answer": second.content[0].text, "ids": (first.id, second.id)}

    first, _ = twice(gw, call, stream)
    assert len(first.requests) == 2
