"""Bad input gets an OpenAI-shaped 4xx; upstream failures are passed on and never stored."""
from __future__ import annotations

import openai
import pytest

from gw_http import CHAT, assert_openai_error, client, get, post, sse_payloads


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": "fake/m1"}, "messages"),
    ({"model": "fake/m1", "messages": []}, "messages"),
    ({"model": "fake/m1", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"model": "fake/m1", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({**CHAT, "temperature": 7}, "temperature"),
    ({**CHAT, "temperature": "hot"}, "temperature"),
    ({**CHAT, "n": 0}, "n"),
    ({**CHAT, "stream": "yes"}, "stream"),
])
def test_invalid_chat_request_names_the_param(upstream, gateway, body, param):
    fake, _ = upstream
    reply = post(gateway().url, "/v1/chat/completions", body)
    assert_openai_error(reply, 400, param=param)
    assert fake.calls == []


def test_unparseable_bodies(upstream, gateway):
    gw = gateway()
    assert_openai_error(post(gw.url, "/v1/chat/completions", b"{not json"), 400, code="invalid_json")
    assert_openai_error(post(gw.url, "/v1/chat/completions", b"[1, 2]"), 400, code="invalid_body")
    assert_openai_error(post(gw.url, "/v1/completions", {"model": "fake/m1"}), 400, param="prompt")
    assert_openai_error(post(gw.url, "/v1/embeddings", {"model": "fake/m1", "input": {"a": 1}}), 400, param="input")


def test_a_body_nested_deeper_than_the_gateway_walks_is_a_400(upstream, gateway):
    fake, _ = upstream
    deep = b'{"a":' * 1000 + b"1" + b"}" * 1000
    for path, body in (("/v1/chat/completions", b'{"model": "fake/m1", "messages": [{"role": "user", "content": "hi"}], "x": '),
                       ("/v1/responses", b'{"model": "fake/m1", "input": "hi", "x": ')):
        assert_openai_error(post(gateway().url, path, body + deep + b"}"), 400, code="invalid_json")
    assert fake.calls == []


@pytest.mark.parametrize("raw", [
    b'{"model": "fake/m1", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "fake/m1", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
])
def test_values_json_cannot_carry_faithfully_are_a_400(upstream, gateway, raw):
    fake, _ = upstream
    assert_openai_error(post(gateway().url, "/v1/chat/completions", raw), 400)
    assert fake.calls == []


def test_body_over_the_cap_is_a_413(upstream, gateway):
    gw = gateway(max_body_bytes=1000)
    reply = post(gw.url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]})
    assert_openai_error(reply, 413, code="request_too_large")


def test_unknown_route_and_method(upstream, gateway):
    gw = gateway()
    assert_openai_error(get(gw.url, "/nowhere"), 404)
    assert_openai_error(post(gw.url, "/healthz", b"{}"), 405)


def test_openai_client_raises_its_own_error_types(upstream, gateway):
    api = client(gateway().url)
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="fake/m1", messages=[{"role": "user", "content": "x"}], temperature=9)
    assert caught.value.param == "temperature"


@pytest.mark.parametrize("status", [400, 429, 500, 503])
def test_upstream_errors_pass_through_and_are_not_cached(upstream, gateway, status):
    fake, _ = upstream
    fake.behaviour.fail_status = status
    fake.behaviour.fail_times = 1
    gw = gateway(upstream_max_attempts=1)  # one attempt: retries have their own tests
    failed = post(gw.url, "/v1/chat/completions", CHAT)
    assert failed.status == status
    assert failed.json()["error"]["code"] == "fake"  # the upstream's own body
    if status == 429:
        assert failed.headers["retry-after"] == "0"
    ok = post(gw.url, "/v1/chat/completions", CHAT)
    assert (ok.status, ok.cache) == (200, "miss")
    assert len(fake.calls) == 2


def test_upstream_error_on_a_stream_request_keeps_its_status(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.fail_status = 500
    fake.behaviour.fail_times = 1
    gw = gateway(upstream_max_attempts=1)  # one attempt: retries have their own tests
    failed = post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True})
    assert failed.status == 500 and failed.json()["error"]["code"] == "fake"
    assert post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True}).cache == "miss"


def test_broken_stream_is_reported_in_band_and_not_stored(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.break_stream_after = 3
    gw = gateway()
    broken = post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True})
    events = sse_payloads(broken.body)
    assert events[-1] != b"[DONE]" and b'"error"' in events[-1]
    fake.behaviour.break_stream_after = None
    assert post(gw.url, "/v1/chat/completions", CHAT).cache == "miss"
    assert len(fake.calls) == 2


def test_unreachable_upstream_is_a_502(gateway):
    from fakes.loopback import free_port
    gw = gateway(upstreams=[f"dead=http://127.0.0.1:{free_port()}/v1"])
    error = assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT), 502, code="upstream_unreachable")
    assert error["type"] == "upstream_error"
