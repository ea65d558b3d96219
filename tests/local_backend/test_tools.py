"""Tool calling on /v1/chat/completions: templates rendered with tools as transformers renders
them, calls parsed per family into OpenAI tool_calls (bodies and streams alike), tool_choice,
ids that replay with the seed, and structured outputs (response_format) under a grammar."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import openai
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from conftest import Server, make_engine
from local_backend import tool_calls
from local_backend.tokenizer import Tokenizer

TEMPLATES = Path(__file__).resolve().parents[2] / "local_backend" / "templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                  "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["city", "days"], "additionalProperties": False}, "strict": True}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                                 "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "user", "content": "and 2 + 3?"},
]


def with_template(checkpoints, tmp_path, arch: str, template: str) -> Path:
    path = shutil.copytree(checkpoints[arch], tmp_path / arch)
    (path / "chat_template.jinja").write_text((TEMPLATES / template).read_text())
    return path


@pytest.fixture(scope="module")
def hermes(checkpoints, tmp_path_factory):
    return make_engine(with_template(checkpoints, tmp_path_factory.mktemp("h"), "qwen3", "chatml_tools.jinja"),
                       max_model_len=2048)


@pytest.mark.parametrize("arch, template", [("qwen3", "chatml_tools.jinja"), ("llama", "llama3_json_tools.jinja")])
def test_templates_render_tools_as_transformers_does(checkpoints, tmp_path, arch, template):
    from local_backend.protocol import ChatRequest
    path = with_template(checkpoints, tmp_path, arch, template)
    ours = Tokenizer(path)
    theirs = PreTrainedTokenizerFast.from_pretrained(path)
    req = ChatRequest.model_validate({"model": "m", "messages": CONVERSATION, "tools": [WEATHER, ADD]})
    messages = [m.for_template() for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    for generation in (True, False):
        expected = theirs.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=False)
        assert ours.render_chat(messages, tools=tools, add_generation_prompt=generation) == expected
    assert "get_weather" in expected and '"arguments": {"city": "Paris", "days": 1}' in expected \
        or '"parameters": {"city": "Paris", "days": 1}' in expected


@pytest.mark.parametrize("kind, text, content, calls", [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>',
     "Let me look.", [("get_weather", '{"city": "Oslo", "days": 2}')]),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n'
               '{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}\n</tool_call>',
     "", [("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3, "b": 4}')]),
    ("hermes", "<tool_call>\n{not json}\n</tool_call>", None, []),
    ("hermes", "no calls here", None, []),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 5, "b": 6}}',
     "", [("add", '{"a": 1, "b": 2}'), ("add", '{"a": 5, "b": 6}')]),
    ("llama3_json", "{\"name\": 3}", None, []),
    ("llama3_json", "Paris is sunny.", None, []),
])
def test_calls_are_parsed_per_family(kind, text, content, calls):
    got_content, got = tool_calls.parse(kind, text)
    assert [(c.name, c.arguments) for c in got] == calls
    assert got_content == (text if content is None else content)


def test_a_stream_holds_only_what_may_begin_a_call():
    assert tool_calls.may_start_call("hermes", "Sure, <tool") == len("Sure, ")
    assert tool_calls.may_start_call("hermes", "Sure, <b>") == len("Sure, <b>")
    assert tool_calls.may_start_call("hermes", "x <tool_call>\n{") == 2
    assert tool_calls.may_start_call("llama3_json", "  {") == 0
    assert tool_calls.may_start_call("llama3_json", "Hello") == 5


async def test_required_and_named_tool_choice_give_valid_calls_streamed_alike(hermes):
    async with Server(hermes, "m") as s:
        for choice in ("required", {"type": "function", "function": {"name": "add"}}):
            kwargs = dict(model="m", messages=CONVERSATION, tools=[WEATHER, ADD], tool_choice=choice, seed=11,
                          temperature=0.8, max_tokens=200, parallel_tool_calls=False)
            r = await s.client.chat.completions.create(**kwargs)
            choice0 = r.choices[0]
            assert choice0.finish_reason == "tool_calls", choice0
            (call,) = choice0.message.tool_calls
            args = json.loads(call.function.arguments)
            if isinstance(choice, dict):
                assert call.function.name == "add"
            assert set(args) == ({"a", "b"} if call.function.name == "add" else {"city", "days"})
            assert call.id.startswith("call_")
            again = await s.client.chat.completions.create(**kwargs)
            assert again.choices[0].message.tool_calls == choice0.message.tool_calls   # ids replay with the seed
            chunks = [c async for c in await s.client.chat.completions.create(**kwargs, stream=True)]
            deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
            assert [(d.index, d.id, d.function.name, d.function.arguments) for d in deltas] == \
                [(0, call.id, call.function.name, call.function.arguments)]
            assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_response_format_json_schema_is_enforced_and_json_object_gives_an_object(hermes):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}, "tags": {"type": "array",
                                               "items": {"enum": ["a", "b"]}, "maxItems": 3}},
              "required": ["name", "age", "tags"], "additionalProperties": False}
    async with Server(hermes, "m") as s:
        for seed in range(3):
            r = await s.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "a person"}], seed=seed, temperature=1.0,
                max_tokens=200, response_format={"type": "json_schema", "json_schema": {
                    "name": "person", "schema": schema, "strict": True}})
            assert r.choices[0].finish_reason == "stop", r.choices[0]
            value = json.loads(r.choices[0].message.content)
            assert set(value) == {"name", "age", "tags"} and isinstance(value["age"], int)
            assert len(value["name"]) <= 12 and set(value["tags"]) <= {"a", "b"}
        r = await s.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "json"}], seed=1, max_tokens=200,
            response_format={"type": "json_object"})
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        else:   # a random model may ramble past max_tokens inside the object; it is still one
            assert r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}, "audio"),
])
async def test_bad_structured_requests_are_400s_naming_the_field(hermes, extra, param):
    async with Server(hermes, "m") as s:
        with pytest.raises(openai.BadRequestError) as e:
            await s.client.chat.completions.create(**{"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                      "max_tokens": 2, "extra_body": extra})
        assert e.value.body["param"] == param
        ok = await s.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        assert ok.choices[0].finish_reason in ("stop", "length")


async def test_tools_on_a_template_that_renders_none_are_refused(qwen3):
    with pytest.raises(openai.BadRequestError) as e:
        await qwen3.client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "x"}],
                                                   tools=[ADD], max_tokens=2)
    assert e.value.body["param"] == "tools"
    r = await qwen3.client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "x"}],
                                                   tools=[ADD], tool_choice="none", max_tokens=2)
    assert r.choices[0].message.tool_calls is None


async def test_min_tokens_and_add_generation_prompt(qwen3, checkpoints):
    tok = Tokenizer(checkpoints["qwen3"])
    chat = [{"role": "user", "content": "hello"}]
    r = await qwen3.client.chat.completions.create(model="qwen3", messages=chat, max_tokens=4, temperature=0,
                                                   extra_body={"add_generation_prompt": False})
    assert r.usage.prompt_tokens == len(tok.encode(tok.render_chat(chat, add_generation_prompt=False), False))
    for seed in range(3):
        r = await qwen3.client.completions.create(model="qwen3", prompt="The", max_tokens=12, seed=seed,
                                                  extra_body={"min_tokens": 10})
        assert r.usage.completion_tokens >= 10


def test_min_tokens_masks_out_every_end_of_sequence_until_reached():
    import numpy as np
    from local_backend.engine.row_mask import RowMask, fill_rows
    from local_backend.engine.sequence import Sequence
    from local_backend.sampling_params import SamplingParams
    params = SamplingParams(seed=0, max_tokens=9, min_tokens=3)
    banned = Sequence(0, [5, 6, 7], 1, params, mask=RowMask(params, frozenset({2, 31, 63}), None))
    free = Sequence(1, [5, 6], 1, SamplingParams(seed=0, max_tokens=9))
    host = np.zeros((4, 3), dtype=np.int32)
    fill_rows(host, [free, banned])   # two generated: end-of-sequence still banned
    allowed = np.unpackbits(host[1].view(np.uint8), bitorder="little")
    assert set(np.flatnonzero(allowed == 0)) == {2, 31, 63} and (host[0] == -1).all()
    banned.token_ids.append(8)
    fill_rows(host, [banned])
    assert (host[0] == -1).all()


async def test_auto_holds_strict_tools_to_their_schema_and_leaves_text_free(hermes):
    """tool_choice auto with a strict tool: the answer is text without a call, or calls whose
    arguments fit the schema (a random model mostly writes text: what it writes is never a
    malformed call)."""
    async with Server(hermes, "m") as s:
        for seed in range(4):
            r = await s.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER, ADD], seed=seed,
                temperature=1.0, max_tokens=40)
            message = r.choices[0].message
            if r.choices[0].finish_reason == "tool_calls":
                for call in message.tool_calls:
                    if call.function.name == "get_weather":
                        assert set(json.loads(call.function.arguments)) == {"city", "days"}
            else:
                assert "<tool_call>" not in message.content and message.tool_calls is None


async def test_top_logprobs_of_a_constrained_row_list_only_tokens_it_could_draw(hermes):
    async with Server(hermes, "m") as s:
        r = await s.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3, logprobs=True, top_logprobs=20,
            response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}})
        first = r.choices[0].logprobs.content[0]
        assert first.token in ("t", "f") or first.token.startswith(("t", "f"))
        assert 1 <= len(first.top_logprobs) < 20 and all(e.logprob > float("-inf") for e in first.top_logprobs)


async def agent_loop(client, model: str) -> tuple[list, list[str]]:
    """A required call, its result, an answer: the calls made and each turn's cache header."""
    messages = [{"role": "user", "content": "weather in Paris?"}]
    first = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, seed=3,
        temperature=0.7, max_tokens=200)
    call = first.parse().choices[0].message
    messages += [call.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "sunny"}]
    second = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, tools=[WEATHER], seed=3, temperature=0.7, max_tokens=20)
    answer = second.parse().choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for m in (call, answer) for c in m.tool_calls or []]
    return calls + [answer.content], [r.headers.get("x-detgate-cache", "") for r in (first, second)]


async def test_an_agent_loop_through_the_gateway_replays_from_the_cache_and_cold_from_the_backend(hermes):
    from fakes.loopback import LoopbackServer
    from gateway.app import create_app
    from gateway.config import Settings
    async with Server(hermes, "m") as backend:
        direct, _ = await agent_loop(backend.client, "m")
        settings = Settings.model_validate({"upstreams": [{"name": "local", "url": backend.url + "/v1"}],
                                            "secret": "s" * 32, "log_level": "WARNING"})
        with LoopbackServer(create_app(settings)) as gateway:
            gw = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
            first, misses = await agent_loop(gw, "local/m")
            again, hits = await agent_loop(gw, "local/m")
            await gw.close()
    assert misses == ["miss", "miss"] and hits == ["hit", "hit"]
    assert first == again == direct   # the same calls, arguments and ids, cached or cold


@pytest.mark.parametrize("extra, check", [
    ({"guided_choice": ["yes", "no", "maybe so"]}, lambda text: text in ("yes", "no", "maybe so")),
    ({"structured_outputs": {"choice": ["alpha", "beta"]}}, lambda text: text in ("alpha", "beta")),
    ({"guided_regex": "[0-9]{3}-[a-c]{2}"}, lambda text: re.fullmatch("[0-9]{3}-[a-c]{2}", text)),
    ({"guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                      "additionalProperties": False}}, lambda text: set(json.loads(text)) == {"ok"}),
    ({"structured_outputs": {"json": '{"type": "array", "items": {"type": "boolean"}, "maxItems": 2}'}},
     lambda text: isinstance(json.loads(text), list)),
])
async def test_vllm_guided_decoding_on_both_endpoints(hermes, extra, check):
    async with Server(hermes, "m") as s:
        for seed in range(2):
            c = await s.client.completions.create(model="m", prompt="answer:", max_tokens=40, seed=seed,
                                                  temperature=1.0, extra_body=extra)
            assert c.choices[0].finish_reason == "stop" and check(c.choices[0].text), c.choices[0].text
            r = await s.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                       max_tokens=40, seed=seed, temperature=1.0, extra_body=extra)
            assert r.choices[0].finish_reason == "stop" and check(r.choices[0].message.content)


@pytest.mark.parametrize("extra, param", [
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_json": "not json"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
    ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar"),
])
async def test_bad_guided_decoding_is_a_400_naming_the_field(hermes, extra, param):
    async with Server(hermes, "m") as s:
        with pytest.raises(openai.BadRequestError) as e:
            await s.client.completions.create(model="m", prompt="x", max_tokens=2, extra_body=extra)
        assert e.value.body["param"] == param


async def test_min_p_one_draws_the_likeliest_token_as_greedy_does(qwen3):
    chat = [{"role": "user", "content": "hello there"}]
    greedy = await qwen3.client.chat.completions.create(model="qwen3", messages=chat, max_tokens=12, temperature=0)
    for seed in range(3):
        floored = await qwen3.client.chat.completions.create(model="qwen3", messages=chat, max_tokens=12, seed=seed,
                                                             temperature=1.0, extra_body={"min_p": 1.0})
        assert floored.choices[0].message.content == greedy.choices[0].message.content
    loose = [await qwen3.client.chat.completions.create(model="qwen3", messages=chat, max_tokens=12, seed=seed,
                                                        temperature=1.0, extra_body={"min_p": 0.0})
             for seed in range(3)]
    assert any(r.choices[0].message.content != greedy.choices[0].message.content for r in loose)


async def test_repetition_penalty_greedy_follows_the_reference_with_the_penalty(qwen3, checkpoints):
    """Greedy under repetition_penalty: each token is the argmax of the reference model's logits
    with the prompt's and answer's tokens penalized, as transformers' and vLLM's penalty does."""
    from reference import ReferenceModel
    reference = ReferenceModel(checkpoints["qwen3"])
    prompt = qwen3.engine.tokenizer.encode("The quick brown fox jumps over the lazy dog", add_special_tokens=False)
    for penalty in (1.0, 1.8):
        r = await qwen3.client.completions.create(model="qwen3", prompt=prompt, max_tokens=10, temperature=0,
                                                  extra_body={"repetition_penalty": penalty, "ignore_eos": True,
                                                              "return_tokens_as_token_ids": True}, logprobs=0)
        got = [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]
        ids = list(prompt)
        for _ in range(10):
            x = reference.logits(ids)[-1]
            seen = torch.zeros_like(x, dtype=torch.bool)
            seen[torch.tensor(sorted(set(ids)))] = True
            x = torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)
            ids.append(int(torch.argmax(x)))
        assert got == ids[len(prompt):], penalty


@pytest.mark.parametrize("arch, template", [("qwen3", "chatml_tools.jinja"), ("llama", "llama3_json_tools.jinja")])
def test_continue_final_message_cuts_where_transformers_does(checkpoints, tmp_path, arch, template):
    path = with_template(checkpoints, tmp_path, arch, template)
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is "}]
    expected = PreTrainedTokenizerFast.from_pretrained(path).apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True, tokenize=False)
    assert Tokenizer(path).render_chat(messages, add_generation_prompt=False, continue_final=True) == expected
    assert expected.endswith("assistant<|end_header_id|>\n\nThe colour is ") or expected.endswith("assistant\nThe colour is ")


async def test_continue_final_message_goes_on_writing_the_last_message(qwen3):
    chat = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "The quick"}]
    r = await qwen3.client.chat.completions.create(
        model="qwen3", messages=chat, max_tokens=4, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    tok = qwen3.engine.tokenizer
    assert r.usage.prompt_tokens == len(tok.encode(tok.render_chat(chat, False, continue_final=True), False))
    with pytest.raises(openai.BadRequestError) as e:
        await qwen3.client.chat.completions.create(model="qwen3", messages=chat, max_tokens=4,
                                                   extra_body={"continue_final_message": True})
    assert e.value.body["param"] == "continue_final_message"
