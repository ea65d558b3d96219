"""Issue 40: the openai-agents SDK in-process, its Runner's tool loop recorded through
`detgate serve --mode record` and replayed in `--mode replay`: every call a hit, the same
final output, the tool called with the same arguments. Plain and streamed runs."""
from __future__ import annotations

import asyncio

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)  # the SDK would otherwise post traces to OpenAI


def _run(base_url: str, streamed: bool, looked_up: list[str]) -> str:
    @function_tool
    def get_forecast(city: str) -> str:
        """The weather forecast for a city."""
        looked_up.append(city)
        return f"sunny in {city}"

    async def go() -> str:
        # Closed inside the loop that opened it, not left to a finalizer after asyncio.run.
        async with AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0) as client:
            agent = Agent(name="forecaster", instructions="Answer with the forecast.", tools=[get_forecast],
                          model=OpenAIResponsesModel(model="gpt-4.1", openai_client=client))
            prompt = "What is the weather in Paris?"
            if not streamed:
                return str((await Runner.run(agent, prompt)).final_output)
            result = Runner.run_streamed(agent, prompt)
            async for _ in result.stream_events():
                pass
            return str(result.final_output)

    return asyncio.run(go())


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_openai_agents_sdk_replays(streamed, fake_agent, gateway):
    fake, upstream = fake_agent
    fake.responses_script = [("get_forecast", {"city": "Paris"})]
    first_calls: list[str] = []
    recorder = gateway(upstream, "record")
    first = _run(recorder.url, streamed, first_calls)
    recorded = len(recorder.posts())
    recorder.__exit__(None, None, None)
    assert first_calls == ["Paris"] and recorded == len(fake.posts("/v1/responses")) == 2

    replayer = gateway(upstream, "replay")
    second_calls: list[str] = []
    second = _run(replayer.url, streamed, second_calls)
    assert [line.get("cache") for line in replayer.posts()] == ["hit"] * recorded
    assert second == first
    assert second_calls == first_calls
    assert len(fake.posts("/v1/responses")) == recorded, "a replay called the upstream"
