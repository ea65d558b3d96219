"""Votes and schema-validated retries on Responses answers, over real HTTP with the
official openai client: a vote reads `output_text` (or the function calls), a schema
check reads `text.format`'s schema and each function call's tool parameters."""
from __future__ import annotations

import openai
import orjson
import pytest

from gw_http import client

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
FORMAT = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}}
RELIABLE = {"upstream_max_attempts": 1, "breaker_failures": 0}  # the gateway's own upstream retries are not under test


def test_a_vote_counts_output_texts_and_is_replayed_with_its_record(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.answer = "Paris"  # what a model says every time at temperature 0; ids and created_at still vary
    api = client(gateway().url)
    first, again = (api.responses.with_raw_response.create(model="fake/m1", input="Capital of France?",
                                                           extra_headers={"x-detgate-vote": "3"}) for _ in range(2))
    assert len(fake.calls) == 2  # two agreeing voters are a majority of three: the third is never asked
    assert first.headers["x-detgate-votes"] == again.headers["x-detgate-votes"] == "2/3"
    assert again.headers["x-detgate-cache"] == "hit" and again.http_response.content == first.http_response.content
    assert again.parse().output_text == "Paris"


def test_a_vote_without_agreement_still_stores_one_answer(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    replies = [api.responses.with_raw_response.create(model="fake/m1", input="A random word?",
                                                      extra_headers={"x-detgate-vote": "3"}) for _ in range(2)]
    assert len(fake.calls) == 3 and replies[0].headers["x-detgate-votes"] == "1/3"
    assert replies[1].http_response.content == replies[0].http_response.content


def test_an_answer_matching_text_format_is_stored_after_one_attempt(upstream, gateway):
    fake, _ = upstream
    reply = client(gateway().url).responses.with_raw_response.create(model="fake/m1", input="A city?", text=FORMAT)
    assert reply.headers["x-detgate-attempts"] == "1" and len(fake.calls) == 1
    assert set(orjson.loads(reply.parse().output_text)) == {"city", "population"}


def test_answers_failing_text_format_are_retried_with_feedback_then_refused(upstream, gateway):
    """With `store: false`: no upstream history holds the feedback, so the retry may show it."""
    fake, _ = upstream
    fake.behaviour.answer = "Lyon, about half a million"  # never the JSON asked for
    gw = gateway(schema_attempts=2, schema_feedback=True, **RELIABLE)
    with pytest.raises(openai.APIStatusError) as failed:
        client(gw.url).responses.create(model="fake/m1", input="A city?", text=FORMAT, store=False)
    assert failed.value.status_code == 502 and failed.value.body["code"] == "schema_validation_failed"
    assert failed.value.response.headers["x-detgate-attempts"] == "2" and len(fake.calls) == 2
    retry = fake.calls[1][1]["input"]
    assert retry[0] == {"role": "user", "content": "A city?"}
    assert retry[1] == {"role": "assistant", "content": "Lyon, about half a million"}
    assert retry[2]["role"] == "user" and "JSON schema" in retry[2]["content"]
    assert "not valid JSON" in retry[2]["content"]
    fake.behaviour.answer = None
    assert client(gw.url).responses.with_raw_response.create(
        model="fake/m1", input="A city?", text=FORMAT, store=False).headers["x-detgate-cache"] == "miss"  # nothing stored


def test_function_call_arguments_are_checked_against_the_tool(upstream, gateway):
    fake, _ = upstream
    tools = [{"type": "function", "name": "census", "parameters": SCHEMA, "strict": True}]
    api = client(gateway(**RELIABLE).url)
    reply = api.responses.with_raw_response.create(model="fake/m1", input="Census of Lyon?", tools=tools)
    call = reply.parse().output[0]
    assert call.type == "function_call" and reply.headers["x-detgate-attempts"] == "1"
    assert set(orjson.loads(call.arguments)) == {"city", "population"}
    stricter = [{**tools[0], "parameters": {**SCHEMA, "properties": {**SCHEMA["properties"],
                                                                      "city": {"type": "string", "maxLength": 0}}}}]
    with pytest.raises(openai.APIStatusError) as failed:
        api.responses.create(model="fake/m1", input="Census of Lyon?", tools=stricter)
    assert failed.value.body["code"] == "schema_validation_failed"
    assert failed.value.body["param"] == "output[0].arguments.city"
