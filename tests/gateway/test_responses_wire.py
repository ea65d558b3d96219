"""The Responses surface as pure functions: which requests share a key, what is sent, and
the two wire forms of an answer (a body, an event stream) made from each other."""
from __future__ import annotations

import orjson
import pytest

from gateway.apis.response_events import ErrorEvent, Unfinished
from gateway.apis.responses import SURFACE
from gateway.errors import UpstreamError
from gateway.policy.canonical import canonical_json
from gateway.upstream.sse import frame


def key(body: dict, text: bool = True) -> bytes:
    return canonical_json(SURFACE.canonical({"model": "m1", **body}, text).key)


@pytest.mark.parametrize("same", [
    {"input": [{"role": "user", "content": "Hi"}]},
    {"input": [{"type": "message", "role": "user", "content": "Hi"}]},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]},
    {"input": "Hi\ufeff"},
    {"input": "Hi", "text": {"format": {"type": "text"}}},
    {"input": "Hi", "background": False, "truncation": "disabled", "include": []},
    {"input": "Hi", "temperature": None, "tools": None},
    {"input": "Hi", "metadata": {"trace": "1"}, "store": False, "user": "u1", "safety_identifier": "s",
     "stream": True, "prompt_cache_key": "k", "service_tier": "flex"},
])
def test_forms_every_responses_server_reads_alike_share_a_key(same):
    assert key(same) == key({"input": "Hi"})


@pytest.mark.parametrize("other", [
    {"input": "Hi!"},
    {"input": [{"role": "system", "content": "Hi"}]},
    {"input": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi"}]},
    {"input": "Hi", "instructions": "Be brief."},
    {"input": "Hi", "previous_response_id": "resp_1"},
    {"input": "Hi", "max_output_tokens": 16},
    {"input": "Hi", "reasoning": {"effort": "low"}},
    {"input": "Hi", "include": ["reasoning.encrypted_content"]},
    {"input": "Hi", "tools": [{"type": "web_search"}]},
])
def test_requests_that_may_be_answered_differently_do_not(other):
    assert key(other) != key({"input": "Hi"})


def test_text_rules_follow_the_text_setting():
    crlf = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a\r\nb"},
                                                   {"type": "input_text", "text": "c"}]}]}
    lf = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a\nb"},
                                                 {"type": "input_text", "text": "c"}]}]}
    assert key(crlf) == key(lf) and key(crlf, text=False) != key(lf, text=False)


def test_reasoning_items_arguments_and_schemas_are_kept_exactly_as_sent():
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA\r\nzz=="}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"b": 1,\r\n "a": 2}'}
    schema = {"type": "object", "properties": {"reasoning": {"type": "string"}, "answer": {"type": "number",
                                                                                           "enum": [1.0, 2]}}}
    body = {"input": [reasoning, call, {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
            "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}
    signed = key(body)
    assert orjson.dumps(reasoning) in signed and orjson.dumps(call["arguments"]) in signed
    assert orjson.dumps(schema) in signed  # member order and 1.0 as written
    sent = SURFACE.upstream_body(SURFACE.canonical({"model": "m1", **body}, True).sent, False)
    assert sent["input"][0] == reasoning and list(sent["input"][0]) == list(reasoning)


def test_unkeyed_fields_are_still_sent_and_stream_options_only_with_a_stream():
    body = {"model": "m1", "input": "Hi", "metadata": {"a": "b"}, "store": False, "stream": True,
            "stream_options": {"include_obfuscation": False}}
    sent = SURFACE.canonical(body, True).sent
    assert SURFACE.upstream_body(sent, True) == {**body}
    assert SURFACE.upstream_body(sent, False) == {"model": "m1", "input": "Hi", "metadata": {"a": "b"}, "store": False}


def response(status: str = "completed", **extra) -> dict:
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": "m1-x", "error": None,
            "incomplete_details": None, "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
            "output": [
                {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "opaque"},
                {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []},
                             {"type": "refusal", "refusal": "No."}]},
                {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "c", "name": "f",
                 "arguments": '{"x": 1}'}],
            **extra}


def record(frames: bytes):
    recorder = SURFACE.recorder("up")
    for block in frames.split(b"\n\n"):
        if block:
            recorder.push(block.split(b"\ndata: ", 1)[1])
    return recorder.finish()


def test_a_body_streams_the_same_way_every_time_and_the_stream_records_back_to_it():
    payload = orjson.dumps(response())
    entry = SURFACE.from_body("up", payload)
    assert SURFACE.from_body("up", payload) == entry
    stream = entry.stream + entry.tail
    numbers = [orjson.loads(b.split(b"\ndata: ")[1])["sequence_number"] for b in stream.split(b"\n\n") if b]
    assert numbers == list(range(len(numbers)))
    assert entry.tail.startswith(b"event: response.completed\n")
    recorded = record(stream)
    assert orjson.loads(recorded.body) == response() and recorded.stream == entry.stream and recorded.tail == entry.tail


def test_a_terminal_without_output_is_assembled_from_the_done_items():
    whole = SURFACE.from_body("up", orjson.dumps(response()))
    cut = whole.tail.split(b"\ndata: ")[1][:-2]
    event = orjson.loads(cut)
    event["response"]["output"] = None
    recorded = record(whole.stream + frame(orjson.dumps(event), "response.completed"))
    assert orjson.loads(recorded.body)["output"] == response()["output"]


@pytest.mark.parametrize("status", ["incomplete", "failed", "queued", "cancelled"])
def test_an_answer_that_did_not_complete_is_passed_on_not_stored(status):
    payload = orjson.dumps(response(status))
    with pytest.raises(Unfinished) as caught:
        SURFACE.from_body("up", payload)
    assert (caught.value.status, caught.value.body) == (200, payload)
    assert SURFACE.in_band_error(caught.value) == b""  # its own terminal event went out live


def test_a_stream_that_does_not_complete_is_not_an_answer():
    whole = SURFACE.from_body("up", orjson.dumps(response()))
    with pytest.raises(UpstreamError) as cut:
        record(whole.stream)
    assert cut.value.code == "upstream_stream_broken"
    failed = frame(orjson.dumps({"type": "response.failed", "response": response("failed")}), "response.failed")
    with pytest.raises(Unfinished):
        record(whole.stream + failed)
    error = orjson.dumps({"type": "error", "code": "server_error", "message": "boom", "param": None,
                          "sequence_number": 9})
    with pytest.raises(ErrorEvent) as failure:
        record(whole.stream + frame(error, "error"))
    assert failure.value.status == 502 and orjson.loads(failure.value.body)["error"]["code"] == "server_error"
    assert SURFACE.in_band_error(failure.value) == b"event: error\ndata: " + error + b"\n\n"
    for bad in (b'{"type": "x\\ny"}', b'[1]', b'{"type": "response.completed"'):
        with pytest.raises(UpstreamError):
            SURFACE.recorder("up").push(bad)


@pytest.mark.parametrize("body", [b'{"error": {"message": "no", "type": "x", "param": null, "code": null}}',
                                  b'{"object": "list"}', b'[]', b'{"object": "response", "status": "completed"}'])
def test_a_200_without_a_response_is_not_an_answer(body):
    with pytest.raises(UpstreamError) as caught:
        SURFACE.from_body("up", body)
    assert caught.value.status == 502
