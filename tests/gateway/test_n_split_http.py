"""n > 1 split into n one-answer requests, each cached on its own key, merged in order."""
from __future__ import annotations

import orjson

from gw_http import CHAT, client, post, sse_payloads


def test_n_is_answered_by_n_seeded_requests_merged_in_order_and_replayed_byte_for_byte(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    first = api.chat.completions.with_raw_response.create(model="fake/m1", messages=CHAT["messages"], n=3, seed=5)
    assert sorted(body["seed"] for _, body in fake.calls) == [5, 6, 7]
    assert not any("n" in body for _, body in fake.calls)
    completion = first.parse()
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert completion.usage.completion_tokens == sum(len(c.message.content.split()) for c in completion.choices)
    assert len(first.headers["x-detgate-key"].split(",")) == 3 and first.headers["x-detgate-cache"] == "miss"
    assert "n=3 answered as 3 requests with seeds 5..7" in first.headers["x-detgate-warnings"]
    again = api.chat.completions.with_raw_response.create(model="fake/m1", messages=CHAT["messages"], n=3, seed=5)
    assert again.headers["x-detgate-cache"] == "hit" and again.http_response.content == first.http_response.content
    # Choice 1 is the answer for seed 6: a plain request with that seed is a hit on its part.
    one = api.chat.completions.with_raw_response.create(model="fake/m1", messages=CHAT["messages"], seed=6)
    assert one.headers["x-detgate-cache"] == "hit"
    assert one.parse().choices[0].message.content == completion.choices[1].message.content
    assert len(fake.calls) == 3


def test_a_streaming_n_request_gets_the_merged_answer_as_a_stream(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    reply = post(gw.url, "/v1/chat/completions", {**CHAT, "n": 2, "stream": True})
    chunks = [orjson.loads(p) for p in sse_payloads(reply.body) if p != b"[DONE]"]
    assert reply.status == 200 and {c["choices"][0]["index"] for c in chunks} == {0, 1}
    assert not any(body.get("stream") for _, body in fake.calls)


def test_a_profile_that_refuses_n_says_so(upstream, gateway):
    fake, url = upstream
    gw = gateway(profiles=[{"name": "single-answer", "n_policy": "reject"}],
                 upstreams=[{"name": "fake", "url": url, "profile": "single-answer"}])
    reply = post(gw.url, "/v1/chat/completions", {**CHAT, "n": 2})
    assert reply.status == 400 and reply.json()["error"]["param"] == "n"
    assert reply.json()["error"]["code"] == "nondeterministic_parameter" and fake.calls == []


def test_a_failing_part_fails_the_request_and_nothing_failed_is_cached(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.fail_status = 400  # not retried by the gateway
    gw = gateway()
    failed = post(gw.url, "/v1/chat/completions", {**CHAT, "n": 2})
    assert failed.status == 400 and failed.json()["error"]["code"] == "fake"
    fake.behaviour.fail_status = None
    assert post(gw.url, "/v1/chat/completions", {**CHAT, "n": 2}).cache == "miss"


def test_off_mode_leaves_n_to_the_upstream(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    reply = post(gw.url, "/v1/chat/completions", {**CHAT, "n": 2}, {"x-detgate-mode": "off"})
    assert reply.status == 200 and len(reply.json()["choices"]) == 2
    assert len(fake.calls) == 1 and fake.calls[0][1]["n"] == 2


PROMPTS = ["Alpha:", "Beta:"]


def _prompt_of(text: str) -> str:
    return next(p for p in PROMPTS if text.startswith(p))  # echo: true puts the prompt first


def test_n_over_several_prompts_is_numbered_prompt_index_times_n_plus_j(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    ask = dict(model="fake/m1", prompt=PROMPTS, n=2, echo=True, seed=11)
    first = api.completions.with_raw_response.create(**ask)
    completion = first.parse()
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert [_prompt_of(c.text) for c in completion.choices] == ["Alpha:", "Alpha:", "Beta:", "Beta:"]
    assert sorted(body["seed"] for _, body in fake.calls) == [11, 12] and not any("n" in b for _, b in fake.calls)
    again = api.completions.with_raw_response.create(**ask)
    assert again.headers["x-detgate-cache"] == "hit" and again.http_response.content == first.http_response.content


def test_a_streamed_split_over_several_prompts_keeps_the_numbering(upstream, gateway):
    gw = gateway()
    reply = post(gw.url, "/v1/completions", {"model": "fake/m1", "prompt": PROMPTS, "n": 2, "echo": True,
                                             "stream": True})
    texts: dict[int, str] = {}
    for payload in sse_payloads(reply.body)[:-1]:
        for choice in orjson.loads(payload)["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert reply.status == 200 and [_prompt_of(texts[i]) for i in range(4)] == ["Alpha:", "Alpha:", "Beta:", "Beta:"]


def test_an_upstream_answering_n_itself_is_stored_with_its_numbering(upstream, gateway):
    """Mode off: n goes to the upstream, whose interleaved stream is assembled by index."""
    fake, _ = upstream
    gw = gateway()
    body = {"model": "fake/m1", "prompt": PROMPTS, "n": 2, "echo": True}
    off = {"x-detgate-mode": "off"}
    streamed = post(gw.url, "/v1/completions", {**body, "stream": True}, off)
    assert streamed.status == 200 and streamed.cache == "miss" and fake.calls[0][1]["n"] == 2
    whole = post(gw.url, "/v1/completions", body, off)
    assert whole.cache == "hit"
    choices = whole.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [_prompt_of(c["text"]) for c in choices] == ["Alpha:", "Alpha:", "Beta:", "Beta:"]
