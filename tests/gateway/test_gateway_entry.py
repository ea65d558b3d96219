"""Stored entries: both wire forms, computed once, round-tripping through each other."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from gateway.apis import SURFACES
from gateway.apis.surface import View
from gateway.cache.entry import CorruptEntry, Entry, Sealer, decode, encode


def from_body(route, body):
    return SURFACES[route].from_body("up", body)


def from_events(route, events):
    recorder = SURFACES[route].recorder("up")
    for event in [*events, b"[DONE]"]:
        recorder.push(event)
    return recorder.finish()


def sse_of(route, entry, usage=True):
    return SURFACES[route].render(entry, View(stream=True, usage=usage))

CHAT_BODY = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m-2024", "system_fingerprint": "fp_1",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "logprobs": None, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"x\": 1}"}}]},
         "logprobs": None, "finish_reason": "tool_calls"},
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
}


def events_of(sse: bytes) -> list[bytes]:
    payloads = [e[len(b"data: "):] for e in sse.split(b"\n\n") if e]
    assert payloads[-1] == b"[DONE]"
    return payloads[:-1]


def test_a_synthesized_stream_assembles_back_to_the_body():
    body = orjson.dumps(CHAT_BODY)
    entry = from_body("chat.completions", body)
    assert entry.body == body and entry.model == "m-2024"
    again = from_events("chat.completions", events_of(sse_of("chat.completions", entry)))
    assert orjson.loads(again.body) == CHAT_BODY
    assert sse_of("chat.completions", again) == sse_of("chat.completions", entry)


def test_streamed_tool_call_fragments_are_joined():
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    deltas = [
        {"role": "assistant", "content": None, "tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                                                               "function": {"name": "lookup", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\": "}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "\"x\"}"}}]},
    ]
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    body = orjson.loads(from_events("chat.completions", [orjson.dumps(c) for c in chunks]).body)
    message = body["choices"][0]["message"]
    assert message["tool_calls"] == [{"id": "call_9", "type": "function",
                                      "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["object"] == "chat.completion"


def test_completion_stream_assembles_text_and_embeddings_have_no_stream():
    head = {"id": "cmpl", "object": "text_completion", "created": 1, "model": "m"}
    chunks = [{**head, "choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": f}]}
              for t, f in (("Once ", None), ("upon", None), ("", "length"))]
    body = orjson.loads(from_events("completions", [orjson.dumps(c) for c in chunks]).body)
    assert body["choices"][0]["text"] == "Once upon" and body["choices"][0]["finish_reason"] == "length"
    assert from_body("embeddings", b'{"object": "list", "data": [{"embedding": [0.5]}], "model": "e"}').stream is None


def test_record_round_trip_and_seal():
    entry = Entry(b'{"a": "\xc3\xa9"}', b"data: {}\n\ndata: [DONE]\n\n", "m")
    assert decode(encode(entry)) == entry
    sealer = Sealer(b"secret")
    sealed = sealer.seal("k1", entry)
    assert sealer.open("k1", sealed) == entry
    with pytest.raises(CorruptEntry):
        sealer.open("k2", sealed)  # copied under another key
    with pytest.raises(CorruptEntry):
        Sealer(b"other").open("k1", sealed)
    with pytest.raises(CorruptEntry):
        decode(b'{"v": 99}')


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80), cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=10))
def test_how_a_stream_was_chunked_never_changes_the_assembled_body(text, cuts):
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    chunks += [{**head, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = from_events("chat.completions", [orjson.dumps(c) for c in chunks]).body
    whole = {**head, "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": "stop"}]}
    assert body == orjson.dumps(whole)
