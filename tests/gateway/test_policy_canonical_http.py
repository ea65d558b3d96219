"""Canonical requests end to end: what the key merges and what the upstream is sent, read
from what the fake upstream received, over loopback HTTP with the official openai client."""
from __future__ import annotations

import pytest

from gw_http import CHAT, assert_openai_error, client, post, samples, value

MESSAGES = [{"role": "user", "content": "Grade this."}]


PROPERTIES = {"reasoning": {"type": "string"}, "answer": {"enum": [1.0, 2]}}


def schema(first: str, second: str) -> dict:
    return {"type": "object", "properties": {first: PROPERTIES[first], second: PROPERTIES[second]},
            "required": [first, second], "additionalProperties": False}


@pytest.mark.parametrize("where", ["json_schema", "json_object schema", "guided_json", "structured_outputs"])
def test_schemas_that_differ_only_in_order_are_two_requests_each_sent_in_its_order(upstream, gateway, where):
    fake, _ = upstream
    fake.behaviour.answer = '{"answer": 2, "reasoning": "r"}'  # a valid answer, so a schema check passes it
    gw = gateway()

    def ask(s: dict):
        extra = {"json_schema": {"response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "grade", "schema": s}}},
                 "json_object schema": {"response_format": {"type": "json_object", "schema": s}},
                 "guided_json": {"guided_json": s},
                 "structured_outputs": {"structured_outputs": {"json": s}}}[where]
        return client(gw.url).chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES,
                                                                        extra_body=extra)

    def received(call: int) -> dict:
        body = fake.calls[call][1]
        return {"json_schema": lambda: body["response_format"]["json_schema"]["schema"],
                "json_object schema": lambda: body["response_format"]["schema"],
                "guided_json": lambda: body["guided_json"],
                "structured_outputs": lambda: body["structured_outputs"]["json"]}[where]()

    reasoning_first, answer_first = ask(schema("reasoning", "answer")), ask(schema("answer", "reasoning"))
    assert reasoning_first.headers["x-detgate-key"] != answer_first.headers["x-detgate-key"]
    assert answer_first.headers["x-detgate-cache"] == "miss" and len(fake.calls) == 2
    assert list(received(0)["properties"]) == ["reasoning", "answer"]
    assert list(received(1)["properties"]) == ["answer", "reasoning"]
    assert type(received(0)["properties"]["answer"]["enum"][0]) is float  # 1.0 reached the decoder as 1.0
    assert ask(schema("reasoning", "answer")).headers["x-detgate-cache"] == "hit"


def test_fields_that_cannot_change_the_answer_are_forwarded_but_not_keyed(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    unkeyed = {"user": "end-user-1", "safety_identifier": "hash-of-user-1", "metadata": {"b": "1", "a": "2"},
               "store": True, "service_tier": "priority", "prompt_cache_key": "tenant-a"}
    first = client(gw.url).chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES, **unkeyed)
    sent = fake.calls[0][1]
    assert {name: sent.get(name) for name in unkeyed} == unkeyed
    assert list(sent["metadata"]) == ["b", "a"]
    other = client(gw.url).chat.completions.with_raw_response.create(
        model="fake/m1", messages=MESSAGES, user="end-user-2", safety_identifier="hash-of-user-2",
        service_tier="flex", prompt_cache_key="tenant-b")
    assert other.headers["x-detgate-cache"] == "hit" and len(fake.calls) == 1
    assert other.headers["x-detgate-key"] == first.headers["x-detgate-key"]


def test_stop_order_is_kept_and_each_order_is_its_own_request(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    a = client(gw.url).completions.with_raw_response.create(model="fake/m1", prompt="List:", stop=[".\n", "\n", ".\n"])
    b = client(gw.url).completions.with_raw_response.create(model="fake/m1", prompt="List:", stop=["\n", ".\n"])
    assert a.headers["x-detgate-key"] != b.headers["x-detgate-key"]
    assert [body["stop"] for _, body in fake.calls] == [[".\n", "\n"], ["\n", ".\n"]]


def test_provider_defaults_share_the_key_of_their_absence(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    image = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    plain = client(gw.url).chat.completions.with_raw_response.create(
        model="fake/m1", messages=[{"role": "user", "content": image}])
    image[1]["image_url"]["detail"] = "auto"
    defaulted = client(gw.url).chat.completions.with_raw_response.create(
        model="fake/m1", messages=[{"role": "user", "content": image}], n=1, stop=[], logprobs=False,
        frequency_penalty=0.0, presence_penalty=0, response_format={"type": "text"})
    assert defaulted.headers["x-detgate-cache"] == "hit"
    assert defaulted.headers["x-detgate-key"] == plain.headers["x-detgate-key"]


DIRTY = "\ufeffSay\u200b hello\r\n10%\r100% \u212a"  # a BOM, a ZWSP, CRLF, a lone CR, the Kelvin sign


def test_text_rules_clean_what_nobody_sees_and_say_so(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    reply = post(gw.url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": DIRTY}]})
    assert reply.status == 200
    assert fake.calls[0][1]["messages"][0]["content"] == "Say hello\n10%\r100% \u212a"
    assert ("text canonicalized (bom, zero_width, crlf); x-detgate-canonical: json-only sends it as written"
            in reply.headers["x-detgate-warnings"])
    metrics = samples(gw.url)
    assert [value(metrics, "detgate_canonical_rules_total", rule=r) for r in ("bom", "zero_width", "crlf", "nfc")] == \
        [1, 1, 1, 0]


def test_json_only_sends_text_as_written_per_request_and_per_upstream(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=[{"name": "fake", "url": url}, {"name": "raw", "url": url, "canonical": "json-only"}])
    body = {**CHAT, "messages": [{"role": "user", "content": DIRTY}]}
    by_header = post(gw.url, "/v1/chat/completions", body, {"x-detgate-canonical": "JSON-only"})
    by_config = post(gw.url, "/v1/chat/completions", {**body, "model": "raw/m1"})
    assert by_header.status == by_config.status == 200
    assert [b["messages"][0]["content"] for _, b in fake.calls] == [DIRTY, DIRTY]
    assert "text canonicalized" not in by_header.headers.get("x-detgate-warnings", "")
    # The header beats the upstream's setting, both ways, and the memo of prepared requests
    # does not answer one setting for the other.
    assert post(gw.url, "/v1/chat/completions", {**body, "model": "raw/m1"},
                {"x-detgate-canonical": "text"}).status == 200
    assert fake.calls[2][1]["messages"][0]["content"] == "Say hello\n10%\r100% \u212a"
    assert post(gw.url, "/v1/chat/completions", body, {"x-detgate-canonical": "json-only"}).cache == "hit"


def test_a_bad_canonical_header_is_a_400_naming_it(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    reply = post(gw.url, "/v1/chat/completions", CHAT, {"x-detgate-canonical": "nfkc"})
    error = assert_openai_error(reply, 400, param="x-detgate-canonical", code="invalid_header")
    assert "text, json-only" in error["message"] and fake.calls == []


def test_a_bad_canonical_header_on_the_messages_route_is_anthropic_shaped(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=[{"name": "claude", "url": url, "profile": "anthropic"}])
    body = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi."}]}
    reply = post(gw.url, "/v1/messages", body, {"x-detgate-canonical": "sometimes"})
    assert reply.status == 400 and fake.calls == []
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "x-detgate-canonical" in error["error"]["message"]
