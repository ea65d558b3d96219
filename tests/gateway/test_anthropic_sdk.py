"""The official anthropic SDK against the gateway and a fake Anthropic provider over real
HTTP: every call a new answer upstream, the same bytes from the gateway."""
from __future__ import annotations

import asyncio

import aiohttp
import anthropic
import orjson
from multidict import CIMultiDict

from claude_http import BODY, HEADERS, MESSAGES, MODEL, WEATHER, events, same, sdk, upstreams
from gw_http import post


def test_create_misses_once_then_hits_with_the_same_bytes(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    replies = [api.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=MESSAGES) for _ in range(3)]
    assert [r.headers["x-detgate-cache"] for r in replies] == ["miss", "hit", "hit"]
    assert len({r.http_response.content for r in replies}) == 1
    assert replies[0].headers["x-detgate-model-version"] == f"{MODEL}-fake-0001"
    assert "no seed" in replies[0].headers["x-detgate-warnings"]
    message = replies[2].parse()
    assert message.content[0].type == "text" and message.content[0].text
    assert len(fake.calls) == 1
    # The operator's key went upstream in Anthropic's header, with the SDK's API version;
    # temperature was fixed and nothing the model refuses (top_p beside it, a seed) was sent.
    sent, headers = fake.calls[0][1], fake.headers[0]
    assert headers["x-api-key"] == "sk-op" and "authorization" not in headers
    assert headers["anthropic-version"] == anthropic._constants.ANTHROPIC_API_VERSION
    assert sent["temperature"] == 0 and not {"top_p", "top_k", "seed", "stream"} & set(sent)


def _streamed(api: anthropic.Anthropic, **kwargs) -> tuple[str, list[str], str]:
    """(x-detgate-cache, the text deltas, the stop reason) of a stream=True create."""
    raw = api.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=MESSAGES, stream=True, **kwargs)
    pieces, stop = [], None
    for event in raw.parse():
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            pieces.append(event.delta.text)
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    return raw.headers["x-detgate-cache"], pieces, stop


def test_stream_true_miss_then_replay_with_the_same_chunks(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    first, second = _streamed(api), _streamed(api)
    assert (first[0], second[0]) == ("miss", "hit")
    assert first[1] == second[1] and len(first[1]) > 1 and first[2] == "end_turn"
    assert len(fake.calls) == 1 and fake.calls[0][1]["stream"] is True


def test_a_live_stream_is_the_bytes_every_replay_gets(upstream, claude, gateway):
    gw = gateway(upstreams=upstreams(upstream, claude))
    body = {**BODY, "stream": True}
    live = post(gw.url, "/v1/messages", body, HEADERS)
    replays = [post(gw.url, "/v1/messages", body, HEADERS) for _ in range(2)]
    assert live.cache == "miss" and [r.cache for r in replays] == ["hit", "hit"]
    assert live.headers["content-type"].startswith("text/event-stream")
    assert live.body == replays[0].body == replays[1].body
    names = [name for name, _ in events(live.body)]
    assert names[0] == "message_start" and names[-1] == "message_stop" and "ping" not in names


def test_messages_stream_helper_and_create_serve_each_other(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    with api.messages.stream(model=MODEL, max_tokens=64, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    whole = api.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    assert whole.headers["x-detgate-cache"] == "hit"
    assert same(whole.parse(), streamed) and streamed.content[0].text == text
    assert len(fake.calls) == 1


def test_a_whole_answer_serves_later_streams_identically(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    api = sdk(gw.url)
    stored = api.messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    cache, pieces, stop = _streamed(api)
    assert cache == "hit" and "".join(pieces) == stored.content[0].text and stop == stored.stop_reason
    streams = [post(gw.url, "/v1/messages", {**BODY, "stream": True}, HEADERS).body for _ in range(2)]
    assert streams[0] == streams[1]
    assert len(fake.calls) == 1


def test_concurrent_identical_calls_make_one_upstream_call(upstream, claude, gateway):
    fake, _ = claude
    fake.behaviour.delay_s = 0.3
    gw = gateway(upstreams=upstreams(upstream, claude))

    async def run():
        api = anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0)
        replies = await asyncio.gather(*(api.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, messages=MESSAGES, stream=i % 2 == 1) for i in range(8)))
        bodies = [await r.http_response.aread() for r in replies]
        await api.close()
        return [r.headers["x-detgate-cache"] for r in replies], bodies

    caches, bodies = asyncio.run(run())
    assert len(fake.calls) == 1
    assert caches.count("miss") == 1 and set(caches) <= {"miss", "coalesced"}
    assert len(set(bodies[0::2])) == 1 and len(set(bodies[1::2])) == 1  # one body, one stream
    assert orjson.loads(bodies[0])["content"] == _assembled(bodies[1])


def _assembled(stream: bytes) -> list[dict]:
    text = "".join(e["delta"].get("text", "") for name, e in events(stream) if name == "content_block_delta")
    return [{"type": "text", "text": text}]


def test_tool_use_answers_replay_in_both_forms(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    api = sdk(gw.url)
    ask = {"model": MODEL, "max_tokens": 64, "messages": MESSAGES, "tools": [WEATHER],
           "tool_choice": {"type": "tool", "name": "get_weather"}}
    with api.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    use = streamed.content[0]
    assert streamed.stop_reason == "tool_use" and use.type == "tool_use" and set(use.input) == {"city", "unit"}
    again = api.messages.with_raw_response.create(**ask)
    assert again.headers["x-detgate-cache"] == "hit" and same(again.parse(), streamed)
    assert len(fake.calls) == 1
    # The tool's schema went upstream member for member as written.
    assert list(fake.calls[0][1]["tools"][0]["input_schema"]) == list(WEATHER["input_schema"])


def test_equivalent_requests_share_an_entry_and_unkeyed_fields_are_forwarded(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    first = api.messages.with_raw_response.create(model=MODEL, max_tokens=64, system="Be brief.", messages=MESSAGES,
                                                  metadata={"user_id": "u-1"})
    second = api.messages.with_raw_response.create(
        model=MODEL, max_tokens=64, system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me a story."}]}],
        metadata={"user_id": "u-2"}, service_tier="auto")
    assert second.headers["x-detgate-cache"] == "hit"
    assert second.http_response.content == first.http_response.content
    assert fake.calls[0][1]["metadata"] == {"user_id": "u-1"}


def test_api_version_and_betas_are_keyed_and_forwarded(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    key = {"x-api-key": "k"}
    unversioned = post(gw.url, "/v1/messages", BODY, key)
    versioned = post(gw.url, "/v1/messages", BODY, {**key, "anthropic-version": "2023-06-01"})
    assert (unversioned.cache, versioned.cache) == ("miss", "hit")  # the version the gateway sends by default
    assert fake.headers[0]["anthropic-version"] == "2023-06-01"
    newer = post(gw.url, "/v1/messages", BODY, {**key, "anthropic-version": "2099-01-01"})
    assert newer.cache == "miss" and newer.key != versioned.key
    beta = post(gw.url, "/v1/messages", BODY, {**key, "anthropic-beta": "b-2,a-1"})
    same = post(gw.url, "/v1/messages", BODY, {**key, "anthropic-beta": "a-1, b-2"})
    assert beta.cache == "miss" and same.cache == "hit" and beta.key not in (versioned.key, newer.key)
    assert fake.headers[-1]["anthropic-beta"] == "a-1,b-2"

    async def on_two_lines() -> str:  # a header sent twice is one list, not its first line
        lines = CIMultiDict([*key.items(), ("anthropic-beta", "b-2"), ("anthropic-beta", "a-1")])
        async with aiohttp.ClientSession() as session:
            async with session.post(gw.url + "/v1/messages", data=orjson.dumps(BODY), headers=lines) as reply:
                return reply.headers["x-detgate-cache"]

    assert asyncio.run(on_two_lines()) == "hit"


def test_clients_authenticate_with_either_header(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude), tenants={"team": "gk-team"})
    by_sdk = sdk(gw.url, api_key="gk-team").messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                                                messages=MESSAGES)
    by_header = post(gw.url, "/v1/messages", BODY, {**HEADERS, "x-api-key": "gk-team"})
    assert (by_sdk.headers["x-detgate-cache"], by_header.cache) == ("miss", "hit")
    # The client's key is the gateway's, never sent upstream: the operator's is.
    assert {h["x-api-key"] for h in fake.headers} == {"sk-op"}


def test_passthrough_sends_the_clients_key_as_anthropic_takes_it(upstream, claude, gateway):
    fake, url = claude
    gw = gateway(upstreams=[{"name": "claude", "url": url, "profile": "anthropic"}], passthrough_auth=True)
    sdk(gw.url, api_key="sk-client").messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    post(gw.url, "/v1/messages", {**BODY, "system": "Hi."}, {**HEADERS, "x-api-key": "sk-client"})
    assert [h.get("x-api-key") for h in fake.headers] == ["sk-client", "sk-client"]
    assert not any("authorization" in h for h in fake.headers)


def test_count_tokens_is_proxied_uncached(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    counts = [api.messages.count_tokens(model=MODEL, messages=MESSAGES) for _ in range(2)]
    assert counts[0].input_tokens == counts[1].input_tokens > 0
    assert [path for path, _ in fake.calls] == ["/v1/messages/count_tokens"] * 2
    assert fake.headers[0]["x-api-key"] == "sk-op"
    raw = api.messages.with_raw_response.count_tokens(model=MODEL, messages=MESSAGES)
    assert raw.headers["x-detgate-cache"] == "bypass"


def test_stream_events_carry_their_names(upstream, claude, gateway):
    gw = gateway(upstreams=upstreams(upstream, claude))
    raw = post(gw.url, "/v1/messages", {**BODY, "stream": True}, HEADERS).body
    assert all(payload["type"] == name for name, payload in events(raw))


def test_a_request_in_a_container_is_passed_through_uncached(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    replies = [post(gw.url, "/v1/messages", {**BODY, "container": "container_1"}, HEADERS) for _ in range(2)]
    assert [r.cache for r in replies] == ["bypass", "bypass"] and len(fake.calls) == 2
    assert "container" in replies[0].headers["x-detgate-warnings"]
