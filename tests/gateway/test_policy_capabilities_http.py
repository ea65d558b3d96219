"""What a model accepts, end to end: the fake upstream answers 400 to a temperature or top_p
sent to an OpenAI reasoning model, as OpenAI does, so a request that succeeds proves the
gateway never sent one."""
from __future__ import annotations

import openai
import pytest

from gw_http import assert_openai_error, client, post

MESSAGES = [{"role": "user", "content": "Think, then answer."}]


def openai_upstream(url: str, **fields) -> list[dict]:
    return [{"name": "fake", "url": url, "profile": "openai", **fields}]


@pytest.mark.parametrize("model, pinned", [("o3", "o3-2025-04-16"), ("gpt-5-mini", "gpt-5-mini-2025-08-07"),
                                           ("o4-mini-2025-04-16", "o4-mini-2025-04-16")])
def test_a_reasoning_model_is_never_sent_temperature_or_top_p(upstream, gateway, model, pinned):
    fake, url = upstream
    gw = gateway(upstreams=openai_upstream(url))
    plain = client(gw.url).chat.completions.with_raw_response.create(model=f"fake/{model}", messages=MESSAGES)
    sent = fake.calls[0][1]
    assert sent["model"] == pinned and "temperature" not in sent and "top_p" not in sent and sent["seed"] == 0
    assert "temperature" not in plain.headers.get("x-detgate-warnings", "")
    asked = client(gw.url).chat.completions.with_raw_response.create(model=f"fake/{model}", messages=MESSAGES,
                                                                     temperature=0, top_p=0.1)
    assert "temperature" not in fake.calls[-1][1] and "top_p" not in fake.calls[-1][1]
    warnings = asked.headers["x-detgate-warnings"]
    assert f"temperature removed: {pinned} does not accept it" in warnings
    assert f"top_p removed: {pinned} does not accept it" in warnings
    # What was dropped is not part of what the answer depends on: one key.
    assert asked.headers["x-detgate-cache"] == "hit"
    assert asked.headers["x-detgate-key"] == plain.headers["x-detgate-key"]


def test_gpt_5_chat_is_no_reasoning_model(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=openai_upstream(url))
    client(gw.url).chat.completions.create(model="fake/gpt-5-chat-latest", messages=MESSAGES)
    assert (fake.calls[0][1]["temperature"], fake.calls[0][1]["top_p"]) == (0, 1)


def test_the_fake_refuses_as_openai_does(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=openai_upstream(url, mode="off"))
    with pytest.raises(openai.BadRequestError) as err:
        client(gw.url).chat.completions.create(model="fake/o3", messages=MESSAGES, temperature=0)
    assert err.value.code == "unsupported_parameter" and err.value.param == "temperature"


def test_reject_mode_names_the_parameter_the_model_refuses(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=openai_upstream(url, mode="reject"))
    reply = post(gw.url, "/v1/chat/completions", {"model": "fake/o3", "messages": MESSAGES, "top_p": 1, "seed": 1})
    error = assert_openai_error(reply, 400, param="top_p", code="unsupported_parameter")
    assert "o3-2025-04-16 does not accept it" in error["message"] and fake.calls == []
    ok = post(gw.url, "/v1/chat/completions", {"model": "fake/o3", "messages": MESSAGES, "seed": 1})
    assert ok.status == 200 and fake.calls[0][1]["seed"] == 1


def test_config_describes_a_model_the_table_does_not_know(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=[{"name": "fake", "url": url}],
                 capabilities={"my-reasoner*": {"accepts": ["seed"], "honours_seed": False}})
    raw = client(gw.url).chat.completions.with_raw_response.create(model="fake/my-reasoner-v2", messages=MESSAGES,
                                                                   temperature=0.5)
    assert "temperature" not in fake.calls[0][1] and "top_p" not in fake.calls[0][1]
    assert "temperature removed: my-reasoner-v2 does not accept it" in raw.headers["x-detgate-warnings"]


def test_a_seed_the_model_refuses_stays_in_the_key_and_never_reaches_it(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=[{"name": "fake", "url": url}],
                 capabilities={"seedless*": {"accepts": ["temperature", "top_p"], "honours_seed": False}})
    # n=3 is split into three one-answer requests: their seeds keep them apart in the key
    # although none is sent.
    reply = client(gw.url).chat.completions.with_raw_response.create(model="fake/seedless-1", messages=MESSAGES, n=3)
    assert len(fake.calls) == 3 and not any("seed" in body for _, body in fake.calls)
    assert len(set(reply.headers["x-detgate-key"].split(","))) == 3
    assert len(reply.parse().choices) == 3
    # Voters and schema retries send no seed either.
    post(gw.url, "/v1/chat/completions", {"model": "fake/seedless-2", "messages": MESSAGES}, {"x-detgate-vote": "3"})
    assert not any("seed" in body for _, body in fake.calls[3:]) and len(fake.calls) >= 5
    # In reject mode too: the gateway asks no seed of the client, and sends none of n's.
    reply = post(gw.url, "/v1/chat/completions", {"model": "fake/seedless-4", "messages": MESSAGES, "temperature": 0,
                                                  "top_p": 1, "n": 2}, {"x-detgate-mode": "reject"})
    assert reply.status == 200 and len(reply.json()["choices"]) == 2
    assert not any("seed" in body for _, body in fake.calls[-2:])
    # A seed the client sends is kept for the key, with a warning, and not sent.
    sent = client(gw.url).chat.completions.with_raw_response.create(model="fake/seedless-3", messages=MESSAGES, seed=7)
    assert "seed" not in fake.calls[-1][1]
    assert "seed 7 kept in the key, not sent: seedless-3 does not accept it" in sent.headers["x-detgate-warnings"]
    other = client(gw.url).chat.completions.with_raw_response.create(model="fake/seedless-3", messages=MESSAGES, seed=8)
    assert other.headers["x-detgate-key"] != sent.headers["x-detgate-key"]


@pytest.mark.parametrize("bad, complaint", [
    ({"o3*": {"accepts": ["min_p"]}}, "accepts"),
    ({"o3*": {"accepts": ["seed"], "honors_seed": False}}, "honors_seed"),
])
def test_bad_capability_rows_refuse_to_start(bad, complaint):
    from pydantic import ValidationError

    from gateway.config import Settings

    with pytest.raises(ValidationError, match=complaint):
        Settings.model_validate({"capabilities": bad})
