"""Agent loops on the real SmolLM2-135M-Instruct (CPU): the official openai client, the
openai-agents SDK's Runner (Chat Completions model, a function tool), langchain-openai
(bind_tools, with_structured_output) and pydantic-ai (a tool and an output_type). Its own
template renders no tools, so the backend serves it with local_backend/templates/chatml_tools.jinja.
A call, the tool's result in a `role: tool` turn, an answer; a cold second run (a new engine)
with the same seed gives the same calls, arguments and ids. And the checkpoint's own template
renders a request with tools exactly as transformers' apply_chat_template does."""
from __future__ import annotations

import json

import openai
import pytest
from transformers import AutoTokenizer

from conftest import ROOT, Server
from local_backend.config import EngineConfig
from local_backend.engine.llm_engine import Engine
from local_backend.smollm2 import checkpoint
from local_backend.tokenizer import Tokenizer

TEMPLATE = ROOT / "local_backend" / "templates" / "chatml_tools.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}, "strict": True}}
TEMPERATURES = {"paris": "18 C and sunny"}


@pytest.fixture(scope="module")
def smollm2():
    return checkpoint(ROOT / ".cache" / "smollm2")


def engine(path) -> Engine:
    return Engine(EngineConfig(model=str(path), device="cpu", max_model_len=2048, chat_template=str(TEMPLATE)))


def test_its_own_template_renders_tools_as_transformers_does(smollm2):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    theirs = AutoTokenizer.from_pretrained(smollm2).apply_chat_template(
        messages, tools=[WEATHER], add_generation_prompt=True, tokenize=False)
    assert Tokenizer(smollm2).render_chat(messages, tools=[WEATHER]) == theirs
    assert Tokenizer(smollm2, TEMPLATE).render_chat(messages, tools=[WEATHER]) != theirs   # this one shows them


async def agent_run(path) -> list:
    """Turns of a two-step agent: call the tool (required), then answer with its result."""
    async with Server(engine(path), "smollm2") as s:
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = await s.client.chat.completions.create(
            model="smollm2", messages=messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, seed=7, temperature=0.2,
            max_tokens=60)
        assert first.choices[0].finish_reason == "tool_calls"
        calls = first.choices[0].message.tool_calls
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        for call in calls:
            city = json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": TEMPERATURES.get(city.lower(), "unknown city")})
        final = await s.client.chat.completions.create(
            model="smollm2", messages=messages, tools=[WEATHER], seed=7, temperature=0, max_tokens=30)
        return [(c.id, c.function.name, c.function.arguments) for c in calls], final.choices[0].message


async def test_an_agent_loop_calls_the_tool_and_replays_cold(smollm2):
    calls, final = await agent_run(smollm2)
    (call_id, name, arguments), = calls
    assert name == "get_weather" and set(json.loads(arguments)) == {"city"}
    assert final.content and not final.tool_calls or final.tool_calls
    again = await agent_run(smollm2)   # a new engine: nothing cached
    assert again == (calls, final)


async def test_a_bad_schema_and_an_unknown_tool_choice_are_400s_and_the_engine_lives(smollm2):
    async with Server(engine(smollm2), "smollm2") as s:
        bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                         "properties": {"x": {"type": "nope"}}}}}
        for kwargs, param in ((dict(tools=[bad], tool_choice="required"), "tools"),
                              (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "g"}}),
                               "tool_choice")):
            with pytest.raises(openai.BadRequestError) as e:
                await s.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "x"}],
                                                       max_tokens=4, **kwargs)
            assert e.value.body["param"] == param
        ok = await s.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=4)
        # Unseeded, so sampled under the checkpoint's generation config: a short answer may end first.
        assert ok.choices[0].finish_reason in ("length", "stop") and ok.choices[0].message.content


async def agents_sdk_run(path) -> tuple[list, str]:
    """The openai-agents SDK's Runner with a function tool on its Chat Completions model: a call
    (tool_choice required, which the SDK resets after the call), the tool run, the answer."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.items import ToolCallItem

    set_tracing_disabled(True)   # the SDK would otherwise post traces to OpenAI

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return TEMPERATURES.get(city.lower(), "unknown city")

    async with Server(engine(path), "smollm2") as s:
        agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                      model=OpenAIChatCompletionsModel("smollm2", s.client),
                      model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                                   max_tokens=40, extra_body={"seed": 7}))
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    calls = [(i.raw_item.call_id, i.raw_item.name, i.raw_item.arguments) for i in result.new_items
             if isinstance(i, ToolCallItem)]
    return calls, result.final_output


async def test_the_openai_agents_sdk_runs_its_loop_and_replays_cold(smollm2):
    calls, answer = await agents_sdk_run(smollm2)
    assert [name for _, name, _ in calls] == ["get_weather"] and set(json.loads(calls[0][2])) == {"city"}
    assert isinstance(answer, str) and answer
    assert await agents_sdk_run(smollm2) == (calls, answer)   # a new engine, the same seed


async def test_langchain_bind_tools_and_with_structured_output(smollm2):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)

    async with Server(engine(smollm2), "smollm2") as s:
        llm = ChatOpenAI(model="smollm2", base_url=s.url + "/v1", api_key="unused", temperature=0, seed=7,
                         max_tokens=60, max_retries=0)
        bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
        question = HumanMessage("What is the weather in Paris?")
        asked = await bound.ainvoke([question])
        (call,) = asked.tool_calls
        assert call["name"] == "get_weather" and set(call["args"]) == {"city"} and call["id"].startswith("call_")
        answer = await llm.bind_tools([WEATHER]).ainvoke(
            [question, asked, ToolMessage(TEMPERATURES.get(call["args"]["city"].lower(), "unknown"),
                                          tool_call_id=call["id"])])
        assert answer.content or answer.tool_calls
        city = await llm.with_structured_output(City, method="json_schema", strict=True).ainvoke(
            "Name a big city and its country.")
        assert isinstance(city, City)


async def test_pydantic_ai_with_a_tool_and_an_output_type(smollm2):
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent, ModelSettings
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Report(BaseModel):
        city: str = Field(max_length=20)
        weather: str = Field(max_length=30)

    async with Server(engine(smollm2), "smollm2") as s:
        model = OpenAIChatModel("smollm2", provider=OpenAIProvider(openai_client=s.client))
        agent = Agent(model, output_type=Report, instructions="Report the weather.",
                      model_settings=ModelSettings(temperature=0, seed=7, max_tokens=80))

        @agent.tool_plain
        def get_weather(city: str) -> str:
            """Current weather of a city."""
            return TEMPERATURES.get(city.lower(), "unknown city")

        result = await agent.run("What is the weather in Paris?")
    assert isinstance(result.output, Report)
