"""Responses that are not complete answers are passed on as they came and never stored
(incomplete, failed, an error event, a stream cut short), and bad requests get an
OpenAI-shaped 400 that the openai client raises as its own BadRequestError."""
from __future__ import annotations

import openai
import pytest

from gw_http import assert_openai_error, client, post, sse_payloads

ASK = {"model": "fake/m1", "input": "Write a long story about a lighthouse."}


def event_types(raw: bytes) -> list[str]:
    return [block.split(b"\n")[0][len(b"event: "):].decode() for block in raw.split(b"\n\n") if block]


@pytest.mark.parametrize("stream", [False, True])
def test_an_incomplete_answer_is_passed_on_and_not_stored(upstream, gateway, monkeypatch, stream):
    fake, _ = upstream
    monkeypatch.setattr(fake.noise, "words", (20, 40))  # always longer than max_output_tokens
    gw = gateway()
    body = {**ASK, "max_output_tokens": 16, "stream": stream}
    replies = [post(gw.url, "/v1/responses", body) for _ in range(2)]
    assert [r.status for r in replies] == [200, 200] and [r.cache for r in replies] == ["miss", "miss"]
    assert len(fake.calls) == 2 and replies[0].body != replies[1].body
    if stream:
        assert event_types(replies[0].body)[-1] == "response.incomplete"
    else:
        assert replies[0].json()["status"] == "incomplete"
        assert replies[0].json()["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_sdk_reads_an_incomplete_answer_as_openai_sends_it(upstream, gateway, monkeypatch):
    fake, _ = upstream
    monkeypatch.setattr(fake.noise, "words", (20, 40))
    api = client(gateway().url)
    response = api.responses.create(**ASK, max_output_tokens=16)
    assert response.status == "incomplete" and len(response.output_text.split()) == 16
    with api.responses.stream(**ASK, max_output_tokens=16) as stream:
        kinds = [event.type for event in stream]
    assert kinds[-1] == "response.incomplete"


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_answer_is_passed_on_and_not_stored(upstream, gateway, stream):
    fake, _ = upstream
    gw = gateway()
    failing = {**ASK, "metadata": {"fake": "failed"}, "stream": stream}  # metadata is forwarded, not keyed
    failed = post(gw.url, "/v1/responses", failing)
    assert failed.status == 200 and failed.cache == "miss"
    if stream:
        assert event_types(failed.body)[-1] == "response.failed"
    else:
        assert failed.json()["status"] == "failed" and failed.json()["error"]["code"] == "server_error"
    fine = post(gw.url, "/v1/responses", {**ASK, "stream": stream})
    assert fine.cache == "miss" and len(fake.calls) == 2  # nothing was stored for the key
    assert post(gw.url, "/v1/responses", {**ASK, "stream": stream}).cache == "hit"


def test_an_error_event_fails_the_stream_and_is_not_stored(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    failing = {**ASK, "stream": True, "metadata": {"fake": "error"}}
    broken = post(gw.url, "/v1/responses", failing)
    assert broken.status == 200 and event_types(broken.body)[-1] == "error"  # as the upstream sent it
    assert b'"code":"server_error"' in sse_payloads(broken.body)[-1]
    with client(gw.url).responses.stream(model=ASK["model"], input=ASK["input"],
                                         metadata={"fake": "error"}) as stream:
        assert [event.type for event in stream][-1] == "error"
    assert post(gw.url, "/v1/responses", {**ASK, "stream": True}).cache == "miss" and len(fake.calls) == 3


def test_a_stream_cut_short_is_not_stored(upstream, gateway):
    fake, _ = upstream
    gw = gateway(upstream_max_attempts=1)
    fake.behaviour.break_stream_after = 4
    cut = post(gw.url, "/v1/responses", {**ASK, "stream": True})
    assert cut.status == 200 and b"upstream_stream_broken" in sse_payloads(cut.body)[-1]
    assert event_types(cut.body)[-1] == "error"  # the wire's own error event, as the SDKs read one
    fake.behaviour.break_stream_after = None
    assert post(gw.url, "/v1/responses", {**ASK, "stream": True}).cache == "miss" and len(fake.calls) == 2


@pytest.mark.parametrize("body, param", [
    ({"model": "fake/m1", "input": 42}, "input"),
    ({"model": "fake/m1", "input": [{"content": "no role, no type"}]}, "input[0]"),
    ({"model": "fake/m1", "input": [{"role": 7, "content": "hi"}]}, "input[0].role"),
    ({"model": "fake/m1", "input": "hi", "temperature": 3}, "temperature"),
    ({"model": "fake/m1", "input": "hi", "stream": "yes"}, "stream"),
    ({"model": "fake/m1", "input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"model": "fake/m1", "input": "hi", "previous_response_id": "resp_1", "conversation": "conv_1"}, "conversation"),
    ({"model": "fake/m1", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                                              "schema": {"type": "nonsense"}}}}, "text.format.schema"),
    ({"input": "hi"}, "model"),
])
def test_bad_input_is_an_openai_shaped_400_that_never_reaches_the_upstream(upstream, gateway, body, param):
    fake, _ = upstream
    reply = post(gateway().url, "/v1/responses", body)
    assert_openai_error(reply, 400, param=param)
    assert fake.calls == []


def test_the_sdk_raises_its_own_error_for_a_bad_request(upstream, gateway):
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway().url).responses.create(model="fake/m1", input="hi", temperature=3)
    assert caught.value.param == "temperature"
