"""The openai-agents SDK's Runner with its Responses model and its Chat Completions model, run
and streamed, with and without a function tool (which the Runner calls, then sends its output
back): a first run misses on every turn, the same run again hits on every turn."""
from __future__ import annotations

import asyncio

import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)
from openai import AsyncOpenAI
from pydantic import BaseModel

from matrix import OPENAI_MODEL, twice

set_tracing_disabled(True)  # the SDK would otherwise post traces to OpenAI
SURFACES = ("chat", "responses")


async def _finish(agent: Agent, prompt: str, stream: bool):
    """The Runner's result once the run is over, streamed events drained to the end."""
    if not stream:
        return await Runner.run(agent, prompt)
    result = Runner.run_streamed(agent, prompt)
    async for _ in result.stream_events():
        pass
    return result


def _run(base: str, surface: str, stream: bool, tool: bool) -> dict:
    searched: list[tuple[str, int]] = []

    @function_tool
    def search(query: str, limit: int) -> str:
        """Search the documentation."""
        searched.append((query, limit))
        return f"{limit} pages about {query}"

    async def go() -> dict:
        # Closed inside the loop that opened it, not left to a finalizer after asyncio.run.
        async with AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
            model_type = OpenAIResponsesModel if surface == "responses" else OpenAIChatCompletionsModel
            # tool_choice required for the first turn only: the Runner resets it once the tool ran.
            agent = Agent(name="librarian", instructions="Answer from the documentation.",
                          model=model_type(model=OPENAI_MODEL, openai_client=client), tools=[search] if tool else [],
                          model_settings=ModelSettings(tool_choice="required" if tool else None))
            prompt = f"openai-agents {surface} stream={stream} tool={tool}: find the install guide."
            result = await _finish(agent, prompt, stream)
        items = [(item.type, getattr(item.raw_item, "call_id", None)) for item in result.new_items]
        return {"output": str(result.final_output), "items": items, "searched": searched}

    return asyncio.run(go())


@pytest.mark.parametrize("tool", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", SURFACES)
def test_openai_agents(gw, surface, stream, tool):
    first, _ = twice(gw, lambda: _run(gw.url, surface, stream, tool), stream)
    assert bool(first.result["searched"]) == tool and len(first.requests) == (2 if tool else 1)


class Search(BaseModel):
    query: str
    limit: int


@pytest.mark.parametrize("stream", [False, True])
def test_openai_agents_structured(gw, stream):
    """An Agent with an output_type on the Responses model: a strict JSON schema in text.format."""
    async def go() -> dict:
        async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as client:
            agent = Agent(name="librarian", instructions="Answer from the documentation.", output_type=Search,
                          model=OpenAIResponsesModel(model=OPENAI_MODEL, openai_client=client))
            prompt = f"openai-agents structured stream={stream}: find the install guide."
            result = await _finish(agent, prompt, stream)
        return result.final_output.model_dump()

    twice(gw, lambda: asyncio.run(go()), stream)
