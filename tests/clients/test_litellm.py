"""litellm's completion() with the openai/ prefix (chat completions) and the anthropic/ prefix
(Messages), and its responses() with openai/, each with api_base at the gateway, plain and
streamed, with and without a tool: a first call misses, the same call again hits with the same
answer."""
from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # it would fetch its price list at import

import litellm  # noqa: E402
import pytest  # noqa: E402

from matrix import CLAUDE_MODEL, OPENAI_MODEL, SEARCH_DESCRIPTION, SEARCH_SCHEMA, twice  # noqa: E402

TOOL = {"type": "function", "function": {"name": "search", "description": SEARCH_DESCRIPTION, "parameters": SEARCH_SCHEMA}}
RESPONSES_TOOL = {"type": "function", "name": "search", "description": SEARCH_DESCRIPTION, "parameters": SEARCH_SCHEMA}
SURFACES = ("chat", "responses", "messages")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic on litellm's own types


def _completion(base: str, surface: str, stream: bool, tool: bool) -> dict:
    prompt = f"litellm {surface} stream={stream} tool={tool}: find the install guide."
    where = {"api_base": base + "/v1", "api_key": "unused", "max_retries": 0}
    if surface == "responses":
        extra = {"tools": [RESPONSES_TOOL]} if tool else {}
        if stream:
            done = [e.response for e in litellm.responses(model=f"openai/{OPENAI_MODEL}", input=prompt, stream=True,
                                                          **where, **extra) if e.type == "response.completed"]
            response = done[0]
        else:
            response = litellm.responses(model=f"openai/{OPENAI_MODEL}", input=prompt, **where, **extra)
        text = "".join(c.text for i in response.output if i.type == "message" for c in i.content if c.type == "output_text")
        calls = [(i.call_id, i.name, i.arguments) for i in response.output if i.type == "function_call"]
        return {"text": text, "tool_calls": calls, "id": response.id}
    if surface == "messages":
        model, where = f"anthropic/{CLAUDE_MODEL}", {**where, "api_base": base}
        extra = {"tools": [TOOL], "tool_choice": "required"} if tool else {}
    else:
        model = f"openai/{OPENAI_MODEL}"
        extra = {"tools": [TOOL], "tool_choice": "required"} if tool else {}
    messages = [{"role": "user", "content": prompt}]
    answer = litellm.completion(model=model, messages=messages, max_tokens=64, stream=stream, **where, **extra)
    if stream:
        answer = litellm.stream_chunk_builder(list(answer), messages=messages)
    message = answer.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    # Translating Messages into its chat shape, litellm makes up a new chatcmpl- id on every call.
    return {"text": message.content, "tool_calls": calls, "id": None if surface == "messages" else answer.id}


@pytest.mark.parametrize("tool", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", SURFACES)
def test_litellm(gw, surface, stream, tool):
    first, _ = twice(gw, lambda: _completion(gw.url, surface, stream, tool), stream)
    assert bool(first.result["tool_calls"]) == tool


@pytest.mark.parametrize("stream", [False, True])
def test_litellm_structured(gw, stream):
    """responses() with a strict JSON schema in text.format."""
    form = {"format": {"type": "json_schema", "name": "search", "schema": SEARCH_SCHEMA, "strict": True}}
    prompt = f"litellm structured stream={stream}: find the install guide."
    where = {"api_base": gw.url + "/v1", "api_key": "unused", "max_retries": 0}

    def call() -> dict:
        if stream:
            events = litellm.responses(model=f"openai/{OPENAI_MODEL}", input=prompt, text=form, stream=True, **where)
            response = [e.response for e in events if e.type == "response.completed"][0]
        else:
            response = litellm.responses(model=f"openai/{OPENAI_MODEL}", input=prompt, text=form, **where)
        text = "".join(c.text for i in response.output if i.type == "message" for c in i.content if c.type == "output_text")
        return {"answer": json.loads(text), "id": response.id}

    twice(gw, call, stream)


@pytest.mark.parametrize("stream", [False, True])
def test_litellm_echo(gw, stream):
    """Two responses() calls that differ only in `metadata`: the second hits, and each reads back
    its own metadata (issue 44)."""
    prompt = f"litellm echo stream={stream}: find the install guide."
    where = {"api_base": gw.url + "/v1", "api_key": "unused", "max_retries": 0}

    def call(request_id: str) -> dict:
        ask = {"model": f"openai/{OPENAI_MODEL}", "input": prompt, "metadata": {"request_id": request_id}, **where}
        if stream:
            response = [e.response for e in litellm.responses(**ask, stream=True) if e.type == "response.completed"][0]
        else:
            response = litellm.responses(**ask)
        text = "".join(c.text for i in response.output if i.type == "message" for c in i.content if c.type == "output_text")
        return {"text": text, "id": response.id, "echo": response.metadata}

    first, second = twice(gw, lambda: call("r-1"), stream, then=lambda: call("r-2"))
    assert (first.echo, second.echo) == ({"request_id": "r-1"}, {"request_id": "r-2"})
