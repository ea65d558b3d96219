"""LangChain's ChatOpenAI (chat completions, and the Responses API with use_responses_api=True) and
ChatAnthropic, invoke and stream, with and without a bound tool: a first call misses, the same
call again hits with the same message."""
from __future__ import annotations

import functools
import operator

import pytest
from pydantic import BaseModel
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from matrix import CLAUDE_MODEL, OPENAI_MODEL, SEARCH_DESCRIPTION, SEARCH_SCHEMA, twice

TOOL = {"type": "function", "function": {"name": "search", "description": SEARCH_DESCRIPTION, "parameters": SEARCH_SCHEMA}}
SURFACES = ("chat", "responses", "messages")


def _model(base: str, surface: str, tool: bool):
    if surface == "messages":
        model = ChatAnthropic(model=CLAUDE_MODEL, base_url=base, api_key="unused", max_retries=0, max_tokens=64)
        return model.bind_tools([TOOL], tool_choice="any") if tool else model
    model = ChatOpenAI(model=OPENAI_MODEL, base_url=base + "/v1", api_key="unused", max_retries=0,
                       use_responses_api=surface == "responses")
    return model.bind_tools([TOOL], tool_choice="required") if tool else model


def _ask(base: str, surface: str, stream: bool, tool: bool) -> dict:
    model = _model(base, surface, tool)
    prompt = f"langchain {surface} stream={stream} tool={tool}: find the install guide."
    message = functools.reduce(operator.add, model.stream(prompt)) if stream else model.invoke(prompt)
    calls = [(c["id"], c["name"], c["args"]) for c in message.tool_calls]
    # LangChain names a message by its own run ("lc_run--...") where the wire's id is not kept.
    wire_id = None if message.id.startswith("lc_run-") else message.id
    return {"text": message.text, "tool_calls": calls, "id": wire_id or message.response_metadata.get("id")}


@pytest.mark.parametrize("tool", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", SURFACES)
def test_langchain(gw, surface, stream, tool):
    first, _ = twice(gw, lambda: _ask(gw.url, surface, stream, tool), stream)
    assert bool(first.result["tool_calls"]) == tool


class Search(BaseModel):
    query: str
    limit: int


@pytest.mark.parametrize("stream", [False, True])
def test_langchain_structured(gw, stream):
    """with_structured_output on the Responses API: a strict JSON schema in text.format."""
    model = ChatOpenAI(model=OPENAI_MODEL, base_url=gw.url + "/v1", api_key="unused", max_retries=0,
                       use_responses_api=True).with_structured_output(Search, method="json_schema", strict=True)
    prompt = f"langchain structured stream={stream}: find the install guide."

    def call() -> dict:
        parsed = list(model.stream(prompt))[-1] if stream else model.invoke(prompt)
        return parsed.model_dump()

    twice(gw, call, stream)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", SURFACES)
def test_langchain_tool_loop(gw, surface, stream):
    """The app runs the tool the model called and sends a ToolMessage back: two requests, both
    hits the second time."""
    def call() -> dict:
        history = [HumanMessage(f"langchain loop {surface} stream={stream}: find the install guide.")]
        answers = []
        for model in (_model(gw.url, surface, True), _model(gw.url, surface, False).bind_tools([TOOL])):
            message = functools.reduce(operator.add, model.stream(history)) if stream else model.invoke(history)
            answers.append((message.text, [(c["id"], c["name"], c["args"]) for c in message.tool_calls]))
            history += [message, *(ToolMessage(f"{c['args']['limit']} pages", tool_call_id=c["id"])
                                   for c in message.tool_calls)]
        return answers

    first, _ = twice(gw, call, stream)
    assert len(first.requests) == 2 and first.result[0][1] and first.result[1][0]
