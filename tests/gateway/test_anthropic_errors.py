"""Failures on /v1/messages in Anthropic's error shape, so that the anthropic SDK raises its
own classes; upstream failures passed on honestly and never stored."""
from __future__ import annotations

import anthropic
import pytest

from claude_http import BODY, HEADERS, MESSAGES, MODEL, events, sdk, upstreams
from gw_http import post


def anthropic_error(reply, status: int, kind: str) -> str:
    """The message of an Anthropic-shaped error reply, after checking its shape."""
    assert reply.status == status, reply.body
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    return body["error"]["message"]


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL, "messages": MESSAGES}, "max_tokens"),
    ({**BODY, "messages": []}, "messages"),
    ({**BODY, "messages": [{"role": 1, "content": "x"}]}, "messages[0].role"),
    ({**BODY, "temperature": 3}, "temperature"),
    ({**BODY, "system": [{"text": "no type"}]}, "system"),
])
def test_bad_input_is_a_400_in_anthropics_shape(upstream, claude, gateway, body, param):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    assert param in anthropic_error(post(gw.url, "/v1/messages", body, HEADERS), 400, "invalid_request_error")
    assert anthropic_error(post(gw.url, "/v1/messages", b"{not json", HEADERS), 400, "invalid_request_error")
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(gw.url).messages.create(model=MODEL, max_tokens=-1, messages=MESSAGES)
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert fake.calls == []


def test_a_wrong_key_is_the_sdks_authentication_error(upstream, claude, gateway):
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude), tenants={"team": "gk-team"})
    with pytest.raises(anthropic.AuthenticationError):
        sdk(gw.url, api_key="wrong").messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    anthropic_error(post(gw.url, "/v1/messages", BODY, {**HEADERS, "x-api-key": "wrong"}), 401, "authentication_error")
    anthropic_error(post(gw.url, "/v1/messages", BODY), 401, "authentication_error")
    # The proxied routes below /v1/messages answer in the same shape.
    anthropic_error(post(gw.url, "/v1/messages/count_tokens", BODY, HEADERS), 401, "authentication_error")
    anthropic_error(post(gw.url, "/v1/messages/batches", BODY, {**HEADERS, "x-api-key": "gk-team"}), 403,
                    "permission_error")
    assert fake.calls == []


def test_a_replay_miss_is_the_sdks_bad_request_error(upstream, claude, gateway):
    # A 400 invalid_request_error, which Claude Code shows the user (a 404 reads as a model error).
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude), mode="replay")
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(gw.url).messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    assert "replay" in raised.value.message.lower() and raised.value.body["error"]["type"] == "invalid_request_error"
    assert fake.calls == []


def test_an_overloaded_upstream_is_passed_on_and_not_stored(upstream, claude, gateway):
    fake, _ = claude
    fake.behaviour.fail_status = 529
    gw = gateway(upstreams=upstreams(upstream, claude), upstream_max_attempts=2)
    api = sdk(gw.url)
    with pytest.raises(anthropic.OverloadedError) as raised:
        api.messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    assert raised.value.body["error"]["type"] == "overloaded_error"
    assert len(fake.calls) == 2  # retried once, as any 5xx
    fake.behaviour.fail_status = None
    again = api.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    assert again.headers["x-detgate-cache"] == "miss" and len(fake.calls) == 3


def test_an_overloaded_error_in_a_200_is_passed_on_and_not_stored(upstream, claude, gateway):
    fake, _ = claude
    fake.behaviour.error_200 = True
    gw = gateway(upstreams=upstreams(upstream, claude))
    with pytest.raises(anthropic.OverloadedError):
        sdk(gw.url).messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    fake.behaviour.error_200 = False
    assert post(gw.url, "/v1/messages", BODY, HEADERS).cache == "miss"


@pytest.mark.parametrize("fault", [{"error_after": 4}, {"break_stream_after": 5}, {"unfinished": True}])
def test_a_stream_that_fails_tells_its_reader_and_is_not_stored(upstream, claude, gateway, fault):
    fake, _ = claude
    for name, value in fault.items():
        setattr(fake.behaviour, name, value)
    gw = gateway(upstreams=upstreams(upstream, claude))
    with pytest.raises(anthropic.APIStatusError):
        for _ in sdk(gw.url).messages.create(model=MODEL, max_tokens=64, messages=MESSAGES, stream=True):
            pass
    failed = post(gw.url, "/v1/messages", {**BODY, "stream": True}, HEADERS)
    names = [name for name, _ in events(failed.body)]
    assert names[-1] == "error" and "message_stop" not in names
    fake.reset()
    assert post(gw.url, "/v1/messages", {**BODY, "stream": True}, HEADERS).cache == "miss"


def test_an_answer_without_a_stop_reason_is_a_502(upstream, claude, gateway):
    fake, _ = claude
    fake.behaviour.unfinished = True
    gw = gateway(upstreams=upstreams(upstream, claude))
    with pytest.raises(anthropic.InternalServerError) as raised:
        sdk(gw.url).messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    assert raised.value.status_code == 502 and "stop_reason" in raised.value.message
    fake.behaviour.unfinished = False
    assert post(gw.url, "/v1/messages", BODY, HEADERS).cache == "miss"


def test_a_model_routed_to_an_upstream_of_another_wire_is_refused(upstream, claude, gateway):
    openai_fake, _ = upstream
    fake, _ = claude
    gw = gateway(upstreams=upstreams(upstream, claude))
    message = anthropic_error(post(gw.url, "/v1/messages", {**BODY, "model": "fake/m1"}, HEADERS), 400,
                              "invalid_request_error")
    assert "'fake'" in message and "/v1/messages" in message
    chat = post(gw.url, "/v1/chat/completions", {"model": "claude/x", "messages": MESSAGES})
    assert chat.status == 400 and "/v1/chat/completions" in chat.json()["error"]["message"]
    assert openai_fake.calls == [] and fake.calls == []


def test_no_upstream_for_messages_is_a_404(upstream, gateway):
    gw = gateway()
    with pytest.raises(anthropic.NotFoundError) as raised:
        sdk(gw.url).messages.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    assert "/v1/messages" in raised.value.message


def test_a_refusal_is_served_but_not_stored(upstream, claude, gateway):
    fake, _ = claude
    fake.behaviour.stop_reason = "refusal"
    gw = gateway(upstreams=upstreams(upstream, claude))
    replies = [post(gw.url, "/v1/messages", BODY, HEADERS) for _ in range(2)]
    assert [r.status for r in replies] == [200, 200] and [r.cache for r in replies] == ["miss", "miss"]
    assert "content_filter" in replies[0].headers["x-detgate-warnings"] and len(fake.calls) == 2
