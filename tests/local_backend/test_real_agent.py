"""An agent loop on the real SmolLM2-135M-Instruct (CPU), through the official openai client:
tools declared, the model made to call one (its own template renders no tools, so the backend
serves it with local_backend/templates/chatml_tools.jinja), the tool's result sent back in a
`role: tool` turn, a final answer. A cold second run (a new engine) with the same seed gives
the same calls, arguments and ids. And the checkpoint's own template renders a request with
tools exactly as transformers' apply_chat_template does."""
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
        assert ok.choices[0].finish_reason == "length"
