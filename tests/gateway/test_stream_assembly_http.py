"""A body assembled from a recorded stream keeps every field the stream carried (issue 22 §2):
text with its logprobs, refusals, tool calls streamed in pieces, audio (id, base64 data
streamed piece by piece, transcript, expires_at), legacy completion logprobs. The fake
streams each of those as OpenAI does; the official client reads both forms."""
from __future__ import annotations

import base64

import orjson
import pytest

from gw_http import client, post, sse_payloads

MESSAGES = [{"role": "user", "content": "Answer in full."}]
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
         for name in ("search", "lookup")]
ASKS = {
    "text+logprobs": {"logprobs": True, "top_logprobs": 2},
    "tool calls": {"tools": TOOLS, "tool_choice": "required"},
    "audio": {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}},
}


def streamed(gw_url: str, path: str, body: dict) -> list[dict]:
    reply = post(gw_url, path, {**body, "stream": True})
    assert reply.status == 200 and reply.cache == "miss", reply.body
    payloads = sse_payloads(reply.body)
    assert payloads[-1] == b"[DONE]"
    return [orjson.loads(p) for p in payloads[:-1]]


def deltas(chunks: list[dict], index: int = 0) -> list[dict]:
    return [c["delta"] for chunk in chunks for c in chunk["choices"] if c["index"] == index]


def whole(gw_url: str, path: str, body: dict) -> dict:
    reply = post(gw_url, path, body)
    assert reply.status == 200 and reply.cache == "hit", reply.body
    return reply.json()


@pytest.mark.parametrize("ask", ASKS)
def test_the_assembled_message_is_what_the_stream_said(upstream, gateway, ask):
    fake, _ = upstream
    gw = gateway()
    body = {"model": "fake/m1", "messages": MESSAGES, **ASKS[ask]}
    chunks = streamed(gw.url, "/v1/chat/completions", body)
    choice = whole(gw.url, "/v1/chat/completions", body)["choices"][0]
    message, parts = choice["message"], deltas(chunks)
    if ask == "text+logprobs":
        assert message["content"] == "".join(d.get("content") or "" for d in parts)
        tokens = [t for chunk in chunks for c in chunk["choices"] for t in (c.get("logprobs") or {}).get("content", [])]
        assert choice["logprobs"]["content"] == tokens and len(tokens) > 1
        assert all(len(t["top_logprobs"]) == 2 for t in tokens)
    elif ask == "tool calls":
        calls = [call for d in parts for call in d.get("tool_calls") or ()]
        assert [c["function"]["name"] for c in message["tool_calls"]] == ["search", "lookup"]
        for i, call in enumerate(message["tool_calls"]):
            mine = [c for c in calls if c["index"] == i]
            assert call["id"] == mine[0]["id"] and call["type"] == "function" and "index" not in call
            assert call["function"]["arguments"] == "".join(c["function"]["arguments"] for c in mine)
            orjson.loads(call["function"]["arguments"])
        assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    else:
        audio = message["audio"]
        pieces = [d["audio"] for d in parts if "audio" in d]
        assert audio["id"] == next(p["id"] for p in pieces if "id" in p)
        assert audio["transcript"] == "".join(p.get("transcript", "") for p in pieces)
        # Each streamed piece is base64 of its own samples; the body holds all of them, as one.
        sent = b"".join(base64.b64decode(p["data"]) for p in pieces if "data" in p)
        assert base64.b64decode(audio["data"], validate=True) == sent and len(sent) > 0
        assert audio["expires_at"] == pieces[-1]["expires_at"]
        # The stream ends on its expires_at with no finish_reason, as gpt-4o-audio-preview's do:
        # complete audio is a finished answer, stored like any other.
        assert not any(c.get("finish_reason") for chunk in chunks for c in chunk["choices"])
        assert choice["finish_reason"] == "stop"
    assert len(fake.calls) == 1


def test_a_refusal_is_assembled_and_read_back_by_the_sdk(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.refuse = True
    gw = gateway()
    api = client(gw.url)
    with api.chat.completions.stream(model="fake/m1", messages=MESSAGES) as stream:  # the SDK accumulates
        streamed_message = stream.get_final_completion().choices[0].message
    stored = api.chat.completions.create(model="fake/m1", messages=MESSAGES)
    assert stored.choices[0].message.refusal == streamed_message.refusal and stored.choices[0].message.content is None
    assert len(streamed_message.refusal.split()) >= 5
    # Replayed as a stream, the SDK assembles the same message again.
    with api.chat.completions.stream(model="fake/m1", messages=MESSAGES) as stream:
        replayed = stream.get_final_completion().choices[0].message
    assert (replayed.role, replayed.content, replayed.refusal) == ("assistant", None, streamed_message.refusal)
    assert len(fake.calls) == 1


def test_tool_calls_filled_whole_replay_as_a_stream_the_sdk_assembles(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    ask = {"model": "fake/m1", "messages": MESSAGES, **ASKS["tool calls"]}
    stored = api.chat.completions.create(**ask)
    with api.chat.completions.stream(**ask) as stream:
        replayed = stream.get_final_completion()
    def calls(message) -> list[tuple]:
        return [(c.id, c.type, c.function.name, c.function.arguments) for c in message.tool_calls]

    assert calls(replayed.choices[0].message) == calls(stored.choices[0].message)
    assert len(calls(stored.choices[0].message)) == 2
    assert len(fake.calls) == 1


def test_completion_logprobs_are_joined_across_chunks(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    body = {"model": "fake/m1", "prompt": "Count:", "logprobs": 2}
    chunks = streamed(gw.url, "/v1/completions", body)
    choice = whole(gw.url, "/v1/completions", body)["choices"][0]
    pieces = [c for chunk in chunks for c in chunk["choices"] if c.get("logprobs")]
    logprobs = choice["logprobs"]
    assert choice["text"] == "".join(c["text"] for chunk in chunks for c in chunk["choices"])
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert logprobs[field] == [v for c in pieces for v in c["logprobs"][field]]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    assert len(fake.calls) == 1
