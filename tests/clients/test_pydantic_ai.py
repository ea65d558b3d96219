"""pydantic-ai's OpenAI chat model, OpenAI Responses model and Anthropic model, run and streamed,
answering in text or through a tool (a structured output, which pydantic-ai asks for as a
required tool call): a first run misses, the same run again hits with the same messages."""
from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from matrix import CLAUDE_MODEL, OPENAI_MODEL, twice

SURFACES = ("chat", "responses", "messages")


class Search(BaseModel):
    """Search the documentation."""

    query: str
    limit: int


def _model(base: str, surface: str):
    if surface == "messages":
        return AnthropicModel(CLAUDE_MODEL, provider=AnthropicProvider(base_url=base, api_key="unused"))
    provider = OpenAIProvider(base_url=base + "/v1", api_key="unused")
    return (OpenAIChatModel if surface == "chat" else OpenAIResponsesModel)(OPENAI_MODEL, provider=provider)


def _run(base: str, surface: str, stream: bool, tool: bool) -> dict:
    # With its default max_tokens pydantic-ai streams even a plain Anthropic request (the SDK
    # requires it); 64 keeps the plain cells plain.
    agent = Agent(_model(base, surface), output_type=Search if tool else str, retries=0,
                  model_settings={"max_tokens": 64})
    prompt = f"pydantic-ai {surface} stream={stream} tool={tool}: find the install guide."

    async def streamed():
        async with agent.run_stream(prompt) as run:
            return await run.get_output(), run.all_messages()

    if stream:
        output, messages = asyncio.run(streamed())
    else:
        result = agent.run_sync(prompt)
        output, messages = result.output, result.all_messages()
    said = [(r.provider_response_id, [(p.content,) if isinstance(p, TextPart) else (p.tool_call_id, p.tool_name, p.args_as_dict())
                                      for p in r.parts if isinstance(p, (TextPart, ToolCallPart))])
            for r in messages if isinstance(r, ModelResponse)]
    return {"output": output.model_dump() if tool else output, "responses": said}


@pytest.mark.parametrize("tool", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", SURFACES)
def test_pydantic_ai(gw, surface, stream, tool):
    first, _ = twice(gw, lambda: _run(gw.url, surface, stream, tool), stream)
    assert isinstance(first.result["output"], dict) == tool


@pytest.mark.parametrize("stream", [False, True])
def test_pydantic_ai_structured(gw, stream):
    """NativeOutput on the Responses model: a strict JSON schema in text.format, not a tool."""
    agent = Agent(_model(gw.url, "responses"), output_type=NativeOutput(Search), retries=0)
    prompt = f"pydantic-ai structured stream={stream}: find the install guide."

    async def streamed():
        async with agent.run_stream(prompt) as run:
            return await run.get_output()

    def call() -> dict:
        output = asyncio.run(streamed()) if stream else agent.run_sync(prompt).output
        return output.model_dump()

    twice(gw, call, stream)


@pytest.mark.parametrize("stream", [False, True])
def test_pydantic_ai_tool_loop(gw, stream):
    """A function tool on the Responses model, which the model calls first: pydantic-ai runs it
    and sends its output back (a function_call_output item), two requests, both hits the second
    time. (The fake chat and Anthropic providers call a tool only when one is required.)"""
    agent = Agent(_model(gw.url, "responses"), retries=0, model_settings={"max_tokens": 64})
    searched = []

    @agent.tool_plain
    def search(query: str, limit: int) -> str:
        """Search the documentation."""
        searched.append((query, limit))
        return f"{limit} pages about {query}"

    prompt = f"pydantic-ai loop stream={stream}: find the install guide."

    async def streamed():
        async with agent.run_stream(prompt) as run:
            return await run.get_output(), run.all_messages()

    def call() -> dict:
        searched.clear()
        if stream:
            output, messages = asyncio.run(streamed())
        else:
            result = agent.run_sync(prompt)
            output, messages = result.output, result.all_messages()
        calls = [(p.tool_call_id, p.args_as_dict()) for m in messages if isinstance(m, ModelResponse)
                 for p in m.parts if isinstance(p, ToolCallPart)]
        return {"output": output, "calls": calls, "searched": list(searched)}

    first, _ = twice(gw, call, stream)
    assert len(first.requests) == 2 and first.result["searched"]
