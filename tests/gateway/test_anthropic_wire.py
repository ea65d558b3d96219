"""The Messages surface on its own: canonical form, keyed headers, and the stream grammar
(a whole answer's stream and back, a recorded stream's frames and body)."""
from __future__ import annotations

import random

import orjson
import pytest

from gateway.apis.anthropic_messages import ANTHROPIC_VERSION, STOP_FRAME, SURFACE
from gateway.apis.surface import NotAnAnswer, View
from gateway.errors import UpstreamError
from gateway.policy.canonical import canonical_json
from claude_http import events

BASE = {"model": "claude-sonnet-4-5", "max_tokens": 64}
USE = {"a": 1, "b": 2}


def key(body: dict) -> bytes:
    SURFACE.validate(body)
    return canonical_json(SURFACE.canonical(body, True).key)


def test_equivalent_spellings_share_a_key():
    plain = {**BASE, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi\nthere"}]}
    blocks = {**BASE, "system": [{"type": "text", "text": "Be brief."}],
              "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi\r\nthere"}]}],
              "metadata": {"user_id": "u-1"}, "service_tier": "auto", "stream": True, "temperature": None}
    assert key(plain) == key(blocks)
    result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}]
    result_blocks = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                   "content": [{"type": "text", "text": "42"}]}]}]
    assert key({**BASE, "messages": result}) == key({**BASE, "messages": result_blocks})
    assert key({**BASE, "messages": plain["messages"], "temperature": 1.0}) == key(
        {**BASE, "messages": plain["messages"], "temperature": 1})


@pytest.mark.parametrize("a, b", [
    # The model reads tool input and schemas as written, and the stop sequences in order.
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]}]},
     {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1.0}}]}]}),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": USE}]}]},
     {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                       "input": dict(reversed(USE.items()))}]}]}),
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {}, "b": {}}}}]},
     {"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"b": {}, "a": {}}}}]}),
    ({"stop_sequences": ["x", "y"]}, {"stop_sequences": ["y", "x"]}),
    # Thinking is signed as sent: not even line ends are touched.
    ({"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "a\r\nb", "signature": "s"}]}]},
     {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "a\nb", "signature": "s"}]}]}),
    # An image is data: kept as sent, member order included.
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "QQ=="}}]}]},
     {"messages": [{"role": "user", "content": [{"type": "image", "source": {"data": "QQ==", "type": "base64"}}]}]}),
])
def test_what_may_change_the_answer_keeps_keys_apart(a, b):
    messages = [{"role": "user", "content": "Hi"}]
    assert key({**BASE, "messages": messages, **a}) != key({**BASE, "messages": messages, **b})


def test_unkeyed_fields_are_still_sent():
    body = {**BASE, "messages": [{"role": "user", "content": "Hi"}], "metadata": {"user_id": "u-1"}, "stream": True}
    canonical = SURFACE.canonical(body, True)
    assert "metadata" not in canonical.key and canonical.sent["metadata"] == {"user_id": "u-1"}
    assert SURFACE.upstream_body(canonical.sent, False).get("stream") is None


def test_keyed_headers_have_one_form():
    assert SURFACE.keyed(()) == (("anthropic-version", ANTHROPIC_VERSION),)
    assert SURFACE.keyed((("anthropic-beta", " b-2 , a-1,b-2"),)) == SURFACE.keyed((("anthropic-beta", "a-1,b-2"),))
    assert SURFACE.keyed((("anthropic-version", "2099-01-01"), ("anthropic-beta", " , "))) == (
        ("anthropic-version", "2099-01-01"),)


MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
           "content": [{"type": "thinking", "thinking": "Hmm.", "signature": "c2ln"},
                       {"type": "redacted_thinking", "data": "b3BhcXVl"},
                       {"type": "text", "text": "See", "citations": [{"type": "char_location", "cited_text": "x"}]},
                       {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"query": "q"}},
                       {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
                       {"type": "tool_use", "id": "tu_1", "name": "f", "input": {"z": [1, 2], "a": {"b": None}}},
                       {"type": "text", "text": ""}],
           "stop_reason": "tool_use", "stop_sequence": None,
           "usage": {"input_tokens": 5, "cache_read_input_tokens": 0, "output_tokens": 9}}


def replay(stream: bytes, cut: int | None = None) -> tuple[list[bytes], object]:
    """Pushes a stream's events through a recorder: (frames it sent live, its entry or failure)."""
    recorder = SURFACE.recorder("up")
    payloads = [chunk.split(b"data: ", 1)[1] for chunk in stream.split(b"\n\n") if chunk][:cut]
    sent = [f for f in map(recorder.push, payloads) if f is not None]
    try:
        return sent, recorder.finish()
    except UpstreamError as exc:
        return sent, exc


def test_a_whole_answer_streams_and_reassembles_to_the_same_bytes():
    entry = SURFACE.from_body("up", orjson.dumps(MESSAGE))
    stream = SURFACE.render(entry, View(stream=True))
    assert stream.endswith(STOP_FRAME) and SURFACE.render(entry, View()) == entry.body
    names = [name for name, _ in events(stream)]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    sent, again = replay(stream)
    assert again.body == entry.body and again.stream == entry.stream and b"".join(sent) == entry.stream
    assert again.model == "claude-x" and again.finish == "stop"


def test_a_recorded_stream_drops_pings_and_holds_message_stop():
    entry = SURFACE.from_body("up", orjson.dumps(MESSAGE))
    rng = random.Random(7)
    noisy = b""
    for chunk in entry.stream.split(b"\n\n")[:-1]:
        noisy += chunk + b"\n\n"
        if rng.random() < 0.5:
            noisy += b'event: ping\ndata: {"type":"ping"}\n\n'
    sent, again = replay(noisy + STOP_FRAME)
    assert b"ping" not in b"".join(sent) and b"message_stop" not in b"".join(sent)
    assert again.body == entry.body


@pytest.mark.parametrize("cut, why", [(None, None), (-1, "message_stop"), (-3, "message_stop"), (1, "message_stop")])
def test_a_stream_is_an_answer_only_at_message_stop(cut, why):
    entry = SURFACE.from_body("up", orjson.dumps({**MESSAGE, "content": [{"type": "text", "text": "Hi"}]}))
    _, found = replay(SURFACE.render(entry, View(stream=True)), cut)
    if why is None:
        assert found.body == entry.body
    else:
        assert isinstance(found, UpstreamError) and why in found.message


def test_an_event_on_several_data_lines_is_sent_on_one():
    recorder = SURFACE.recorder("up")
    start = orjson.dumps({"type": "message_start", "message": {**MESSAGE, "content": []}}, option=orjson.OPT_INDENT_2)
    frame = recorder.push(start)
    assert frame.count(b"\n") == 3 and events(frame) == [("message_start", orjson.loads(start))]


def test_failures_in_a_stream_are_passed_on_not_stored():
    recorder = SURFACE.recorder("up")
    with pytest.raises(UpstreamError) as raised:
        recorder.push(b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}')
    assert "before message_start" in raised.value.message
    recorder = SURFACE.recorder("up")
    recorder.push(orjson.dumps({"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}}))
    error = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    with pytest.raises(UpstreamError) as raised:
        recorder.push(error)
    assert raised.value.status == 529 and raised.value.body == error
    # A stream that ends with message_stop but never said why it stopped holds no answer.
    recorder = SURFACE.recorder("up")
    recorder.push(orjson.dumps({"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}}))
    recorder.push(b'{"type":"message_stop"}')
    with pytest.raises(NotAnAnswer):
        recorder.finish()


@pytest.mark.parametrize("body, status", [
    ({**MESSAGE, "stop_reason": None}, 502),
    ({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, 529),
    ({"type": "message", "content": "not blocks", "stop_reason": "end_turn"}, 502),
])
def test_a_whole_body_without_an_answer_is_not_stored(body, status):
    with pytest.raises(UpstreamError) as raised:
        SURFACE.from_body("up", orjson.dumps(body))
    assert raised.value.status == status


def test_stop_reasons_rank_for_storing():
    finishes = {reason: SURFACE.from_body("up", orjson.dumps({**MESSAGE, "stop_reason": reason})).finish
                for reason in ("end_turn", "tool_use", "stop_sequence", "pause_turn", "max_tokens", "refusal")}
    assert finishes == {"end_turn": "stop", "tool_use": "stop", "stop_sequence": "stop", "pause_turn": "stop",
                        "max_tokens": "length", "refusal": "content_filter"}
