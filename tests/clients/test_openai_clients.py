"""The openai clients, Python and Node, on chat completions and Responses, plain and streamed,
with and without a tool: a first call misses, the same call again hits with what the app saw."""
from __future__ import annotations

import openai
import pytest
from pydantic import BaseModel

from matrix import OPENAI_MODEL, SEARCH_DESCRIPTION, SEARCH_SCHEMA, node, node_twice, twice

SURFACES = ("chat", "responses")
MODES = [(stream, tool) for stream in (False, True) for tool in (False, True)]
CHAT_TOOL = {"type": "function", "function": {"name": "search", "description": SEARCH_DESCRIPTION,
                                               "parameters": SEARCH_SCHEMA}}
RESPONSES_TOOL = {"type": "function", "name": "search", "description": SEARCH_DESCRIPTION,
                  "parameters": SEARCH_SCHEMA, "strict": True}


class Search(BaseModel):
    query: str
    limit: int


def _prompt(client: str, surface: str, stream: bool, tool: bool) -> str:
    # Every cell asks its own question, so no cell hits another's entry.
    return f"{client} {surface} stream={stream} tool={tool}: find the install guide."


def _python(base: str, surface: str, stream: bool, tool: bool) -> dict:
    api = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    prompt = _prompt("openai-python", surface, stream, tool)
    if surface == "chat":
        extra = {"tools": [CHAT_TOOL], "tool_choice": "required"} if tool else {}
        messages = [{"role": "user", "content": prompt}]
        if not stream:
            message = api.chat.completions.create(model=OPENAI_MODEL, messages=messages, **extra).choices[0].message
            calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()]
            return {"text": message.content, "tool_calls": calls}
        text, calls = "", {}
        for chunk in api.chat.completions.create(model=OPENAI_MODEL, messages=messages, stream=True, **extra):
            delta = chunk.choices[0].delta if chunk.choices else None
            text += (delta and delta.content) or ""
            for c in (delta and delta.tool_calls) or ():
                id_, name, args = calls.get(c.index, ("", "", ""))
                calls[c.index] = (id_ + (c.id or ""), name + (c.function.name or ""), args + (c.function.arguments or ""))
        return {"text": text, "tool_calls": list(calls.values())}
    extra = {"tools": [RESPONSES_TOOL]} if tool else {}
    if stream:
        with api.responses.stream(model=OPENAI_MODEL, input=prompt, **extra) as events:
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            response = events.get_final_response()
    else:
        response = api.responses.create(model=OPENAI_MODEL, input=prompt, **extra)
        text = response.output_text
    calls = [(i.call_id, i.name, i.arguments) for i in response.output if i.type == "function_call"]
    return {"text": text, "tool_calls": calls, "id": response.id}


@pytest.mark.parametrize("stream,tool", MODES)
@pytest.mark.parametrize("surface", SURFACES)
def test_openai_python(gw, surface, stream, tool):
    first, _ = twice(gw, lambda: _python(gw.url, surface, stream, tool), stream)
    assert bool(first.result["tool_calls"]) == tool


@pytest.mark.parametrize("stream", [False, True])
def test_openai_python_structured(gw, stream):
    """responses.parse / responses.stream with a text_format: a strict JSON schema, which the
    gateway checks the answer against."""
    api = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    prompt = f"openai-python structured stream={stream}: find the install guide."

    def call() -> dict:
        if stream:
            with api.responses.stream(model=OPENAI_MODEL, input=prompt, text_format=Search) as events:
                response = events.get_final_response()
        else:
            response = api.responses.parse(model=OPENAI_MODEL, input=prompt, text_format=Search)
        return {"parsed": response.output_parsed.model_dump(), "id": response.id}

    twice(gw, call, stream)


@pytest.mark.parametrize("stream,tool", MODES)
@pytest.mark.parametrize("surface", SURFACES)
def test_openai_node(gw, node_clients, surface, stream, tool):
    ask = {"base": gw.url, "surface": surface, "model": OPENAI_MODEL, "stream": stream, "tool": tool,
           "prompt": _prompt("openai-node", surface, stream, tool)}

    first = node_twice(gw, "openai_node.mjs", ask, stream)
    assert bool(first.result["tool_calls"]) == tool


def test_a_miss_is_put_down_to_the_field_that_differed(gw):
    """The harness itself: when a client's second call misses, the failure names the request
    field that changed (here the prompt), as a matrix cell that stops holding would."""
    api = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    prompts = iter(["harness: first", "harness: second"] * 2)

    def call() -> str:
        messages = [{"role": "user", "content": next(prompts)}]
        return api.chat.completions.create(model=OPENAI_MODEL, messages=messages).choices[0].message.content

    with pytest.raises(AssertionError) as failed:
        twice(gw, call, False)
    assert 'body $.messages[0].content: "harness: first" -> "harness: second"' in str(failed.value)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_python_echo(gw, stream):
    """Two calls that differ only in `metadata` (out of the key): the second hits, and each app
    reads back its own metadata from the response, as it matches a response to its request
    (issue 44), also through responses.stream(...).get_final_response()."""
    api = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    prompt = f"openai-python echo stream={stream}: find the install guide."

    def call(request_id: str) -> dict:
        ask = {"model": OPENAI_MODEL, "input": prompt, "metadata": {"request_id": request_id}}
        if stream:
            with api.responses.stream(**ask) as events:
                response = events.get_final_response()
        else:
            response = api.responses.create(**ask)
        return {"text": response.output_text, "id": response.id, "echo": response.metadata}

    first, second = twice(gw, lambda: call("r-1"), stream, then=lambda: call("r-2"))
    assert (first.echo, second.echo) == ({"request_id": "r-1"}, {"request_id": "r-2"})


@pytest.mark.parametrize("stream", [False, True])
def test_openai_node_echo(gw, node_clients, stream):
    """As test_openai_python_echo, with the npm client."""
    ask = {"base": gw.url, "surface": "responses", "model": OPENAI_MODEL, "stream": stream, "tool": False,
           "prompt": f"openai-node echo stream={stream}: find the install guide."}

    def call(request_id: str) -> dict:
        out = node("openai_node.mjs", {**ask, "metadata": {"request_id": request_id}})
        out.pop("cache")
        return out

    first, second = twice(gw, lambda: call("r-1"), stream, then=lambda: call("r-2"))
    assert (first.echo, second.echo) == ({"request_id": "r-1"}, {"request_id": "r-2"})
