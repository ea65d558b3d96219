"""De-randomization by what each Claude model takes, votes without a seed, and schema-checked
tool inputs, on /v1/messages. The fake provider refuses what the real API refuses, so a
parameter sent where the model does not take it fails the test with the API's own 400."""
from __future__ import annotations

import anthropic
import pytest

from claude_http import BODY, HEADERS, MESSAGES, MODEL, WEATHER, sdk, same, upstreams
from gw_http import post


@pytest.mark.parametrize("model, asked, sent", [
    # Claude before Opus 4.7: temperature fixed at 0; top_p never beside it, top_k never.
    ("claude-sonnet-4-6", {}, {"temperature": 0}),
    ("claude-sonnet-4-6", {"temperature": 0.7, "top_p": 0.5, "top_k": 5}, {"temperature": 0.7}),
    ("claude-3-5-haiku-20241022", {"top_p": 1}, {"temperature": 0}),
    # Opus 4.7 and later take no sampling parameter at all.
    ("claude-opus-4-7", {}, {}),
    ("claude-opus-4-7", {"temperature": 0, "top_k": 1}, {}),
    ("claude-sonnet-5", {"top_p": 0.9}, {}),
    # Extended thinking samples at temperature 1, without top_k, whatever the model.
    ("claude-sonnet-4-6", {"thinking": {"type": "enabled", "budget_tokens": 1024}, "temperature": 0, "top_k": 3}, {}),
])
def test_sampling_parameters_are_sent_only_where_the_model_takes_them(upstream, claude, gateway, model, asked, sent):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    reply = post(gw.url, "/v1/messages", {**BODY, "model": model, **asked}, HEADERS)
    assert reply.status == 200, reply.body
    body = fake.calls[0][1]
    assert {p: body[p] for p in ("temperature", "top_p", "top_k", "seed") if p in body} == sent
    warnings = reply.headers["x-detgate-warnings"]
    assert "no seed" in warnings
    for param in set(asked) - set(sent) - {"thinking"}:
        assert param in warnings
    assert post(gw.url, "/v1/messages", {**BODY, "model": model, **asked}, HEADERS).cache == "hit"


def test_reject_mode_names_the_parameter_the_model_refuses(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(gw.url).messages.create(model="claude-opus-4-7", max_tokens=64, messages=MESSAGES,
                                    extra_body={"temperature": 0}, extra_headers={"x-detgate-mode": "reject"})
    assert "temperature" in raised.value.message
    assert fake.calls == []


def test_thinking_answers_replay_with_their_signatures(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    ask = {"model": MODEL, "max_tokens": 2048, "messages": MESSAGES,
           "thinking": {"type": "enabled", "budget_tokens": 1024}}
    with api.messages.stream(**ask) as stream:
        thought = "".join(e.thinking for e in stream if e.type == "thinking")
        streamed = stream.get_final_message()
    block = streamed.content[0]
    assert block.type == "thinking" and block.thinking == thought and block.signature
    whole = api.messages.with_raw_response.create(**ask)
    assert whole.headers["x-detgate-cache"] == "hit" and same(whole.parse(), streamed)
    # Sent back in the next turn, the thinking is keyed as signed: a second turn is one entry.
    turn = {**ask, "messages": [*MESSAGES, {"role": "assistant", "content": [b.to_dict() for b in streamed.content]},
                                {"role": "user", "content": "Go on."}]}
    assert api.messages.with_raw_response.create(**turn).headers["x-detgate-cache"] == "miss"
    assert api.messages.with_raw_response.create(**turn).headers["x-detgate-cache"] == "hit"
    assert len(fake.calls) == 2


def test_a_vote_runs_without_a_seed_and_replays_its_record(upstream, claude, gateway):
    fake, _ = claude
    fake.behaviour.answer = "Paris."
    gw = gateway(upstreams=upstreams(upstream, claude))
    vote = {**HEADERS, "x-detgate-vote": "3"}
    first = post(gw.url, "/v1/messages", BODY, vote)
    assert first.status == 200 and first.headers["x-detgate-votes"] == "2/3"
    assert len(fake.calls) == 2 and fake.calls[0][1] == fake.calls[1][1]  # the same request: no seed to vary
    streamed = post(gw.url, "/v1/messages", {**BODY, "stream": True}, vote)
    assert streamed.cache == "hit" and streamed.headers["x-detgate-votes"] == "2/3"
    assert post(gw.url, "/v1/messages", BODY, vote).body == first.body and len(fake.calls) == 2


def test_tool_inputs_are_checked_against_their_schema_and_retried(upstream, claude, gateway):
    fake, _ = claude
    fake.behaviour.invalid_input_times = 1
    gw = gateway(upstreams=upstreams(upstream, claude), schema_feedback=True)
    ask = {**BODY, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}}
    reply = post(gw.url, "/v1/messages", ask, HEADERS)
    assert reply.status == 200 and reply.headers["x-detgate-attempts"] == "2"
    use = reply.json()["content"][0]
    assert use["type"] == "tool_use" and set(use["input"]) == {"city", "unit"}
    # The retry showed the model its rejected tool use, answered by an error tool_result.
    retry = fake.calls[1][1]["messages"]
    assert retry[1]["role"] == "assistant" and retry[1]["content"][0]["type"] == "tool_use"
    result = retry[2]["content"][0]
    assert result["type"] == "tool_result" and result["is_error"] is True
    assert result["tool_use_id"] == retry[1]["content"][0]["id"] and "unexpected" in result["content"]
    again = post(gw.url, "/v1/messages", {**ask, "stream": True}, HEADERS)
    assert again.cache == "hit" and again.headers["x-detgate-attempts"] == "2" and len(fake.calls) == 2


def test_a_structured_output_that_never_matches_is_a_502_and_not_stored(upstream, claude, gateway):
    fake, _ = claude
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    ask = {**BODY, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    gw = gateway(upstreams=upstreams(upstream, claude), schema_attempts=2)
    fake.behaviour.answer = "four"
    with pytest.raises(anthropic.InternalServerError) as raised:
        sdk(gw.url).messages.create(**ask)
    assert raised.value.status_code == 502 and "schema" in raised.value.message and len(fake.calls) == 2
    fake.behaviour.answer = '{"answer": 4}'
    reply = post(gw.url, "/v1/messages", ask, HEADERS)
    assert reply.cache == "miss" and reply.headers["x-detgate-attempts"] == "1"


def test_an_undated_name_is_pinned_to_its_snapshot(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    reply = sdk(gw.url).messages.with_raw_response.create(model="claude-haiku-4-5", max_tokens=64, messages=MESSAGES)
    assert fake.calls[0][1]["model"] == "claude-haiku-4-5-20251001"
    assert "claude-haiku-4-5 pinned to claude-haiku-4-5-20251001" in reply.headers["x-detgate-warnings"]
    assert reply.headers["x-detgate-model-version"] == "claude-haiku-4-5-20251001-fake-0001"
