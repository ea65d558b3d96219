"""Unkeyed fields a response echoes (metadata, user, safety_identifier, prompt_cache_key,
service_tier) are shown to every reader as it sent them, in the body and in every stream
frame that carries the response object, live, coalesced or replayed: a tenant sharing
entries never reads another's, and an app matching metadata back to its request always
finds its own (issue 44)."""
from __future__ import annotations

import threading
import time

import orjson

from claude_http import events
from tenant_pair import openai_as, start

ASK = {"model": "fake/m1", "input": "Summarize the quarter."}
ALICE = {"metadata": {"email": "alice@example.com", "request_id": "a-1"}, "user": "alice-7",
         "safety_identifier": "sid-alice", "prompt_cache_key": "alice-cache", "service_tier": "flex"}
BOB = {"metadata": {"request_id": "b-1"}, "user": "bob-9"}
SHOWN = ("metadata", "user", "safety_identifier", "prompt_cache_key", "service_tier")
# What a reader that left a field out is shown: the wire's own default, never another's value.
BOB_SHOWN = {"metadata": {"request_id": "b-1"}, "user": "bob-9", "safety_identifier": None, "prompt_cache_key": None,
             "service_tier": "default"}


def shown(response: dict) -> dict:
    return {name: response.get(name) for name in SHOWN}


def frames_with_response(raw: bytes) -> list[dict]:
    return [payload["response"] for _, payload in events(raw) if "response" in payload]


def test_a_reader_sharing_an_entry_is_shown_its_own_fields(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    gw = start(gateway, upstream, claude, redis_url, shared_cache_tenants=["alice", "bob"])
    alice, bob = openai_as(gw, "alice"), openai_as(gw, "bob")
    hers = alice.responses.with_raw_response.create(**ASK, **ALICE)
    assert shown(hers.parse().to_dict()) == {**ALICE}
    his = bob.responses.with_raw_response.create(**ASK, **BOB)
    assert his.headers["x-detgate-cache"] == "hit" and len(fake.calls) == 1
    assert shown(orjson.loads(his.http_response.content)) == BOB_SHOWN
    assert b"alice" not in his.http_response.content
    with bob.responses.stream(**ASK, **BOB) as stream:
        final = stream.get_final_response()
    assert shown(final.to_dict(mode="json")) == BOB_SHOWN
    raw = bob.responses.with_raw_response.create(**ASK, **BOB, stream=True).http_response.read()
    assert [shown(r) for r in frames_with_response(raw)] == [BOB_SHOWN] * 3 and b"alice" not in raw
    assert final.output_text == his.parse().output_text == hers.parse().output_text  # the one answer


def test_coalesced_live_streams_each_show_their_own_request_id(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    fake.behaviour.chunk_delay_s = 0.02  # slow enough that both streams share one live call
    gw = start(gateway, upstream, claude, redis_url)
    api = openai_as(gw, "alice")
    got: dict[str, tuple[str, list[dict]]] = {}

    def ask(request_id: str) -> None:
        reply = api.responses.with_raw_response.create(**ASK, metadata={"request_id": request_id}, stream=True)
        got[request_id] = (reply.headers["x-detgate-cache"], frames_with_response(reply.http_response.read()))

    threads = [threading.Thread(target=ask, args=(f"r-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(cache for cache, _ in got.values()) == ["coalesced", "miss"] and len(fake.calls) == 1
    for request_id, (_, responses) in got.items():
        assert [r["metadata"] for r in responses] == [{"request_id": request_id}] * 3
    replayed = api.responses.with_raw_response.create(**ASK, metadata={"request_id": "r-0"}, stream=True)
    assert frames_with_response(replayed.http_response.read()) == got["r-0"][1]  # live and replay alike


def test_an_unfinished_answer_is_passed_on_in_the_shape_and_with_the_fields_each_reader_asked(
        upstream, claude, gateway, redis_url):
    """A stream that joined a body's call which failed gets a stream ending in response.failed,
    not the body, and each reader its own metadata; nothing is stored."""
    fake, _ = upstream
    fake.behaviour.delay_s = 0.3  # the stream joins the body's call in flight
    gw = start(gateway, upstream, claude, redis_url)
    api = openai_as(gw, "alice")
    got = {}

    def body() -> None:
        got["body"] = api.responses.with_raw_response.create(**ASK, metadata={"fake": "failed", "request_id": "r-0"})

    thread = threading.Thread(target=body)
    thread.start()
    time.sleep(0.1)
    stream = api.responses.with_raw_response.create(**ASK, metadata={"request_id": "r-1"}, stream=True)
    thread.join()
    assert len(fake.calls) == 1 and stream.headers["x-detgate-cache"] == "coalesced"
    assert stream.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in events(stream.http_response.read())]
    assert names[0] == "response.created" and names[-1] == "response.failed"
    assert {r["metadata"]["request_id"] for r in frames_with_response(stream.http_response.read())} == {"r-1"}
    assert got["body"].parse().status == "failed" and got["body"].parse().metadata["request_id"] == "r-0"


def test_a_chat_completion_shows_each_reader_the_tier_it_asked_for(upstream, claude, gateway, redis_url):
    """Chat completions repeat one request field, `service_tier`, in the body and every chunk."""
    fake, _ = upstream
    gw = start(gateway, upstream, claude, redis_url, shared_cache_tenants=["alice", "bob"])
    ask = {"model": "fake/m1", "messages": [{"role": "user", "content": "Hello."}]}
    hers = openai_as(gw, "alice").chat.completions.create(**ask, service_tier="flex")
    assert hers.service_tier == "flex"
    bob = openai_as(gw, "bob")
    his = bob.chat.completions.with_raw_response.create(**ask)
    assert his.headers["x-detgate-cache"] == "hit" and his.parse().service_tier == "default"
    chunks = list(bob.chat.completions.create(**ask, service_tier="priority", stream=True))
    assert {chunk.service_tier for chunk in chunks} == {"priority"} and len(fake.calls) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == his.parse().choices[0].message.content
