"""A schema-validated retry never hands out an id whose upstream history differs from what
its client holds: on Responses (where the upstream keeps each answer's history unless
`store: false`) a retry asks again exactly as the client asked, with no feedback turn
(issue 44); with `store: false` no history is kept, and the feedback is shown."""
from __future__ import annotations

import openai
import orjson
import pytest

from tenant_pair import openai_as, start

FORMAT = {"format": {"type": "json_schema", "name": "city", "strict": True,
                     "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                                "additionalProperties": False}}}
RELIABLE = {"upstream_max_attempts": 1, "breaker_failures": 0}  # the gateway's own upstream retries are not under test


def test_a_stored_responses_retry_is_the_clients_own_request(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    fake.behaviour.answer = "Lyon"  # never the JSON asked for
    gw = start(gateway, upstream, claude, redis_url, schema_attempts=3, schema_feedback=True, **RELIABLE)
    alice = openai_as(gw, "alice")
    with pytest.raises(openai.APIStatusError) as failed:
        alice.responses.create(model="fake/m1", input="A city?", text=FORMAT)
    assert failed.value.status_code == 502 and len(fake.calls) == 3
    assert [body for _, body in fake.calls] == [fake.calls[0][1]] * 3  # no rejected answer, no feedback upstream
    fake.behaviour.answer = None
    served = alice.responses.create(model="fake/m1", input="A city?", text=FORMAT)
    kept = fake.responses.inputs[served.id]  # the history its id names upstream
    assert [item["content"] for item in kept] == ["A city?"] and set(orjson.loads(served.output_text)) == {"city"}


def test_an_unstored_retry_shows_the_model_its_mistake(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    fake.behaviour.answer = "Lyon"
    gw = start(gateway, upstream, claude, redis_url, schema_attempts=2, schema_feedback=True, **RELIABLE)
    with pytest.raises(openai.APIStatusError):
        openai_as(gw, "alice").responses.create(model="fake/m1", input="A city?", text=FORMAT, store=False)
    retry = fake.calls[1][1]["input"]
    assert retry[1] == {"role": "assistant", "content": "Lyon"} and "JSON schema" in retry[2]["content"]
