"""The Responses API through the gateway with the official openai client (`responses.create`,
`.parse`, `.stream`) over real HTTP, against a fake upstream that answers every call
with new ids, text and stream chunking: repeats are hits with the same bytes, identical
requests in flight share one call, and a stored answer serves streams and bodies alike."""
from __future__ import annotations

import asyncio

import openai
import orjson
from pydantic import BaseModel

from gw_http import client, post

ASK = {"model": "fake/m1", "input": "Name three colours."}


class Colours(BaseModel):
    reasoning: str
    answer: list[str]
    count: int


def events(raw: bytes) -> list[tuple[str, dict]]:
    """(event name, payload) of each SSE event, checking that the two name it alike."""
    out = []
    for block in raw.split(b"\n\n"):
        if block:
            name, data = block.split(b"\n")
            assert name.startswith(b"event: ") and data.startswith(b"data: "), block
            payload = orjson.loads(data[len(b"data: "):])
            assert payload["type"] == name[len(b"event: "):].decode()
            out.append((payload["type"], payload))
    return out


def test_a_repeat_is_a_hit_with_the_same_bytes_and_one_upstream_call(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    replies = [api.responses.with_raw_response.create(**ASK) for _ in range(3)]
    assert [r.headers["x-detgate-cache"] for r in replies] == ["miss", "hit", "hit"]
    assert len({r.http_response.content for r in replies}) == 1
    assert len(fake.calls) == 1 and fake.calls[0][0] == "/v1/responses"
    sent = fake.calls[0][1]
    assert sent["model"] == "m1" and "seed" not in sent  # the key carries a seed the wire has none of
    response = replies[2].parse()
    assert response.status == "completed" and response.output_text
    assert replies[0].headers["x-detgate-model-version"] == "m1-fake-0001"


def test_the_fake_is_nondeterministic_and_the_gateway_is_not(upstream, gateway):
    """Measured, not asserted: unique outputs over five calls, straight and through the gateway."""
    fake, base = upstream
    straight = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    api = client(gateway().url)
    direct = {straight.responses.create(**ASK).output_text for _ in range(5)}
    served = {api.responses.create(**ASK).output_text for _ in range(5)}
    assert (len(direct), len(served)) == (5, 1)


def test_parse_with_a_pydantic_model(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    first = api.responses.parse(model="fake/m1", input="Three colours, as JSON.", text_format=Colours)
    again = api.responses.parse(model="fake/m1", input="Three colours, as JSON.", text_format=Colours)
    assert isinstance(first.output_parsed, Colours) and again.output_parsed == first.output_parsed
    assert again.id == first.id and len(fake.calls) == 1
    schema = fake.calls[0][1]["text"]["format"]["schema"]
    assert list(schema["properties"]) == ["reasoning", "answer", "count"]  # the order asked for, kept


def test_stream_helper_miss_then_replay(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)

    def run():
        with api.responses.stream(model="fake/m1", input="Tell a short story.") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            return deltas, stream.get_final_response()

    (deltas, final), (replayed, again) = run(), run()
    assert deltas == replayed and "".join(deltas) == final.output_text  # same text, same chunking
    assert again.model_dump() == final.model_dump() and len(fake.calls) == 1
    assert fake.calls[0][1]["stream"] is True


def test_a_stream_serves_a_body_and_the_body_a_stream(upstream, gateway):
    gw = gateway()
    streamed = {**ASK, "input": "First streamed.", "stream": True}
    live = post(gw.url, "/v1/responses", streamed)
    assert live.cache == "miss" and live.headers["content-type"].startswith("text/event-stream")
    final = events(live.body)[-1][1]["response"]
    body = post(gw.url, "/v1/responses", {**streamed, "stream": False})
    assert body.cache == "hit" and body.json() == final
    replay = post(gw.url, "/v1/responses", streamed)
    assert replay.cache == "hit" and replay.body == live.body  # the recorded frames, event lines and all
    numbers = [payload["sequence_number"] for _, payload in events(replay.body)]
    assert numbers == list(range(len(numbers)))  # the upstream's own numbering, kept

    whole = post(gw.url, "/v1/responses", {**ASK, "input": "First whole."})
    assert whole.cache == "miss"
    synthesized = [post(gw.url, "/v1/responses", {**ASK, "input": "First whole.", "stream": True}) for _ in range(2)]
    assert {r.cache for r in synthesized} == {"hit"} and synthesized[0].body == synthesized[1].body
    kinds = [t for t, _ in events(synthesized[0].body)]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert events(synthesized[0].body)[-1][1]["response"] == whole.json()
    with client(gw.url).responses.stream(model="fake/m1", input="First whole.") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        assert stream.get_final_response().id == whole.json()["id"]
    assert text == stream.get_final_response().output_text


async def test_identical_requests_in_flight_share_one_upstream_call(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.delay_s = 1.0  # keep the first call in the air while the others arrive
    api = openai.AsyncOpenAI(base_url=gateway().url + "/v1", api_key="unused", max_retries=0)
    replies = await asyncio.gather(*(api.responses.with_raw_response.create(**ASK, stream=i % 2 == 0)
                                     for i in range(8)))
    assert len(fake.calls) == 1
    assert sorted(r.headers["x-detgate-cache"] for r in replies) == ["coalesced"] * 7 + ["miss"]
    bodies = {r.http_response.content for r in replies[1::2]}
    assert len(bodies) == 1
    streams = [b"".join([chunk async for chunk in r.http_response.aiter_bytes()]) for r in replies[0::2]]
    assert len(set(streams)) == 1 and events(streams[0])[-1][1]["response"] == orjson.loads(bodies.pop())
    await api.close()


def test_function_calls_and_their_outputs_are_keyed_and_replayed(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    tools = [{"type": "function", "name": "lookup", "description": "Look a city up.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    call = api.responses.create(model="fake/m1", input="Weather in Paris?", tools=tools).output[0]
    assert call.type == "function_call" and "city" in orjson.loads(call.arguments)
    followup = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}]
    answers = [api.responses.with_raw_response.create(model="fake/m1", input=followup, tools=tools) for _ in range(2)]
    assert [a.headers["x-detgate-cache"] for a in answers] == ["miss", "hit"]
    assert answers[1].parse().output[0].type == "message" and len(fake.calls) == 2


def test_a_reasoning_model_is_sent_no_sampling_parameters(upstream, gateway):
    fake, _ = upstream
    reply = client(gateway().url).responses.with_raw_response.create(
        model="fake/o3-mini", input="Why is the sky blue?", reasoning={"effort": "low"}, temperature=0)
    sent = fake.calls[0][1]
    assert not {"temperature", "top_p", "seed"} & set(sent) and sent["reasoning"] == {"effort": "low"}
    assert "temperature removed" in reply.headers["x-detgate-warnings"]
    assert reply.parse().output[0].type == "reasoning"
