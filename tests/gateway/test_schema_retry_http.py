"""Schema-validated retries through the gateway, with the official openai client over loopback HTTP."""
from __future__ import annotations

import openai
import orjson
import pytest

from fakes.noisy_upstream import INVALID, NoisyUpstream
from gw_http import client, post
from noisy_gw import ANSWER, ANSWER_SCHEMA, QUESTION, metric, noisy_gateway

SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
RELIABLE = {"upstream_max_attempts": 1, "breaker_failures": 0}  # the gateway's own upstream retries are not under test


def ask(gw, headers=None, **kwargs):
    kwargs.setdefault("response_format", SCHEMA_FORMAT)
    return client(gw.url).chat.completions.with_raw_response.create(model="m1", messages=QUESTION,
                                                                    extra_headers=headers or {}, **kwargs)


def test_an_invalid_answer_is_retried_with_the_next_seed_and_only_the_valid_one_is_cached():
    fake = NoisyUpstream(by_seed={0: INVALID, 1: "yes"})
    with noisy_gateway(fake) as gw:
        first, second = ask(gw), ask(gw)
        assert [c["seed"] for c in fake.calls] == [0, 1]
        assert (first.headers["x-detgate-cache"], second.headers["x-detgate-cache"]) == ("miss", "hit")
        assert first.headers["x-detgate-attempts"] == second.headers["x-detgate-attempts"] == "2"
        assert first.http_response.content == second.http_response.content
        assert orjson.loads(first.parse().choices[0].message.content)["answer"] == "yes"
        assert metric(gw, 'detgate_schema_attempts_total{model="m1",result="invalid"}') == 1
        assert metric(gw, 'detgate_schema_attempts_total{model="m1",result="valid"}') == 1


def test_when_every_attempt_fails_the_error_names_the_schema_path_and_nothing_is_cached():
    fake = NoisyUpstream(by_seed={0: INVALID, 1: INVALID})
    with noisy_gateway(fake, schema_attempts=2, **RELIABLE) as gw:
        with pytest.raises(openai.APIStatusError) as failed:
            ask(gw)
        error = failed.value
        assert error.status_code == 502 and error.body["code"] == "schema_validation_failed"
        assert error.response.headers["x-detgate-attempts"] == "2"
        assert "$" in error.body["message"] and ("not valid JSON" in error.body["message"] or
                                                 "is not of type 'string'" in error.body["message"])
        assert metric(gw, 'detgate_schema_attempts_total{model="m1",result="exhausted"}') == 1
        fake.by_seed = {0: "yes"}
        again = ask(gw)
        assert again.headers["x-detgate-cache"] == "miss" and len(fake.calls) == 3


def test_feedback_shows_the_model_its_failed_answer_and_the_errors():
    fake = NoisyUpstream(by_seed={0: INVALID, 1: "yes"})
    with noisy_gateway(fake, schema_feedback=True) as gw:
        ask(gw)
        retry = fake.calls[1]["messages"]
        assert retry[:1] == QUESTION and [m["role"] for m in retry[1:]] == ["assistant", "user"]
        assert retry[1]["content"] == fake.sent[0]["content"] and "JSON schema" in retry[2]["content"]


def test_an_invalid_schema_in_the_request_is_400_before_any_upstream_call():
    fake = NoisyUpstream()
    with noisy_gateway(fake) as gw:
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
        reply = post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": QUESTION, "response_format": bad})
        assert reply.status == 400 and reply.json()["error"]["param"] == "response_format.json_schema.schema"
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"required": "city"}}}]
        reply = post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": QUESTION, "tools": tools})
        assert reply.status == 400 and reply.json()["error"]["param"] == "tools[0].function.parameters"
        assert fake.calls == []


def test_a_named_schema_from_config_is_checked_when_the_header_names_it():
    fake = NoisyUpstream(by_seed={0: INVALID, 1: "no"})
    with noisy_gateway(fake, schemas={"answer": ANSWER_SCHEMA}) as gw:
        raw = ask(gw, {"x-detgate-schema": "answer"}, response_format=openai.NOT_GIVEN)
        assert raw.headers["x-detgate-attempts"] == "2"
        reply = post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": QUESTION}, {"x-detgate-schema": "nope"})
        assert reply.status == 400 and reply.json()["error"]["code"] == "unknown_schema"
        assert "'answer'" in reply.json()["error"]["message"]


def test_tool_call_arguments_are_checked_against_the_tools_parameters():
    fake = NoisyUpstream(tool="weather", by_seed={0: INVALID, 1: "yes"})
    with noisy_gateway(fake) as gw:
        raw = ask(gw, tools=WEATHER, response_format=openai.NOT_GIVEN)
        call = raw.parse().choices[0].message.tool_calls[0]
        assert raw.headers["x-detgate-attempts"] == "2" and orjson.loads(call.function.arguments) == {"city": "Paris"}


def test_a_vote_runs_among_valid_answers_only():
    # Voter 0 (seeds 0, then 0+3) never validates; voters 1 and 2 agree.
    fake = NoisyUpstream(by_seed={0: INVALID, 3: INVALID, 1: "yes", 2: "yes"})
    with noisy_gateway(fake, schema_attempts=2, strategies={"*": {"extractor": ANSWER}}) as gw:
        raw = ask(gw, {"x-detgate-vote": "3"})
        assert sorted(c["seed"] for c in fake.calls) == [0, 1, 2, 3]
        assert raw.headers["x-detgate-votes"] == "2/3" and raw.headers["x-detgate-attempts"] == "4"
        hit = ask(gw, {"x-detgate-vote": "3"})
        assert hit.headers["x-detgate-cache"] == "hit" and hit.headers["x-detgate-attempts"] == "4"


def streamed_text(raw) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)


def test_a_stream_goes_out_live_and_an_invalid_answer_is_passed_on_but_never_stored():
    fake = NoisyUpstream(by_seed={0: INVALID, 1: "yes"})
    with noisy_gateway(fake) as gw:
        raw = ask(gw, stream=True)
        assert streamed_text(raw) == fake.sent[0]["content"]  # the upstream's answer, as it came
        assert [c.get("stream") for c in fake.calls] == [True]  # one live call: no retry behind the client's back
        assert metric(gw, 'detgate_schema_attempts_total{model="m1",result="streamed_invalid"}') == 1
        assert post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": QUESTION, "response_format": SCHEMA_FORMAT},
                    {"x-detgate-cache-control": "only-if-cached"}).status == 404
        whole = ask(gw)  # a whole answer may be retried: seed 0 fails again, seed 1 is stored
        assert whole.headers["x-detgate-cache"] == "miss" and whole.headers["x-detgate-attempts"] == "2"
        replay = ask(gw, stream=True)
        assert replay.headers["x-detgate-cache"] == "hit" and orjson.loads(streamed_text(replay))["answer"] == "yes"


def test_a_valid_streamed_answer_is_stored_once_complete_and_replayed_byte_for_byte():
    fake = NoisyUpstream(by_seed={0: "yes"})
    body = {"model": "m1", "messages": QUESTION, "response_format": SCHEMA_FORMAT, "stream": True}
    with noisy_gateway(fake) as gw:
        first, second = post(gw.url, "/v1/chat/completions", body), post(gw.url, "/v1/chat/completions", body)
        assert (first.headers["x-detgate-cache"], second.headers["x-detgate-cache"]) == ("miss", "hit")
        assert first.body == second.body and len(fake.calls) == 1
        assert second.headers["x-detgate-attempts"] == "1"
        assert metric(gw, 'detgate_schema_attempts_total{model="m1",result="valid"}') == 1


def test_a_streamed_tool_call_with_bad_arguments_is_passed_on_and_not_stored():
    fake = NoisyUpstream(tool="weather", by_seed={0: INVALID})
    with noisy_gateway(fake) as gw:
        stream = client(gw.url).chat.completions.create(model="m1", messages=QUESTION, tools=WEATHER, stream=True)
        arguments = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                            for c in stream if c.choices and c.choices[0].delta.tool_calls)
        assert orjson.loads(arguments) == {"city": 7}  # as the upstream sent it, wrong type and all
        assert [c.get("stream") for c in fake.calls] == [True]  # tools alone retry nothing behind a stream
        fake.by_seed = {0: "yes"}
        again = client(gw.url).chat.completions.with_raw_response.create(model="m1", messages=QUESTION, tools=WEATHER)
        assert again.headers["x-detgate-cache"] == "miss" and len(fake.calls) == 2


def test_a_stream_that_names_a_schema_waits_for_a_valid_answer_and_says_so():
    fake = NoisyUpstream(by_seed={0: INVALID, 1: "yes"})
    with noisy_gateway(fake, schemas={"answer": ANSWER_SCHEMA}) as gw:
        raw = ask(gw, {"x-detgate-schema": "answer"}, stream=True)
        assert orjson.loads(streamed_text(raw))["answer"] == "yes" and raw.headers["x-detgate-attempts"] == "2"
        assert "stream buffered" in raw.headers["x-detgate-warnings"]
        assert not any(c.get("stream") for c in fake.calls)  # retried whole, as asked


STRICT_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}


@pytest.mark.parametrize("profile, calls", [("whitebox", 1), ("generic-openai-compatible", 2)])
def test_a_backend_that_decodes_under_strict_schemas_is_not_checked_or_retried(profile, calls):
    """Against a whitebox upstream (grammar-constrained, seeded) a strict schema holds by
    construction and a retry would fetch the same answer: the gateway says so and sends one
    call. A black box is checked and retried as ever."""
    fake = NoisyUpstream(by_seed={0: INVALID, 1: "yes"})
    with noisy_gateway(fake, {"profile": profile}) as gw:
        r = ask(gw, response_format=STRICT_FORMAT)
        assert len(fake.calls) == calls
        warnings = r.headers.get("x-detgate-warnings", "")
        assert ("no schema check" in warnings) == (profile == "whitebox")
        nonstrict = ask(gw, response_format=SCHEMA_FORMAT)   # not strict: checked everywhere
        assert nonstrict.headers["x-detgate-attempts"] == "2"
