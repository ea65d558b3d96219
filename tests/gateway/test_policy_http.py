"""Model pinning and parameter de-randomization through the gateway, over loopback HTTP."""
from __future__ import annotations

import pytest

from gw_http import CHAT, client, post
from noisy_gw import metric

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def fake_upstream(url: str, **fields) -> list[dict]:
    return [{"name": "fake", "url": url, **fields}]


def test_an_alias_is_pinned_before_keying_and_sent_pinned(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=fake_upstream(url, profile="openai"))
    first = client(gw.url).chat.completions.with_raw_response.create(model="fake/gpt-4o", messages=MESSAGES)
    assert fake.calls[0][1]["model"] == "gpt-4o-2024-08-06"
    assert "model gpt-4o pinned to gpt-4o-2024-08-06" in first.headers["x-detgate-warnings"]
    pinned = client(gw.url).chat.completions.with_raw_response.create(model="fake/gpt-4o-2024-08-06", messages=MESSAGES)
    assert pinned.headers["x-detgate-cache"] == "hit" and pinned.headers["x-detgate-key"] == first.headers["x-detgate-key"]


def test_an_upstream_that_is_not_openai_is_sent_the_name_the_client_used(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=[*fake_upstream(url), {"name": "azure", "url": url, "profile": "azure"}],
                 profiles=[{"name": "azure", "aliases": {"gpt-4o": "prod-gpt-4o"}}])
    raw = client(gw.url).chat.completions.with_raw_response.create(model="fake/gpt-4o", messages=MESSAGES)
    assert fake.calls[0][1]["model"] == "gpt-4o" and "pinned" not in raw.headers.get("x-detgate-warnings", "")
    client(gw.url).chat.completions.create(model="azure/gpt-4o", messages=MESSAGES)
    assert fake.calls[1][1]["model"] == "prod-gpt-4o"


def test_config_overrides_and_unpins_the_openai_profiles_aliases(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=[*fake_upstream(url, profile="openai"), {"name": "vllm", "url": url}],
                 aliases={"gpt-4o": "gpt-4o-2024-11-20", "gpt-4": False})
    for model in ("fake/gpt-4o", "fake/gpt-4", "vllm/gpt-4o"):
        client(gw.url).chat.completions.create(model=model, messages=MESSAGES)
    assert [body["model"] for _, body in fake.calls] == ["gpt-4o-2024-11-20", "gpt-4", "gpt-4o"]


def test_enforce_sends_and_keys_the_derandomized_request_and_says_what_changed(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    raw = client(gw.url).chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES, top_p=0.5,
                                                                   extra_body={"top_k": 40})
    sent = fake.calls[0][1]
    assert (sent["temperature"], sent["top_p"], sent["seed"], "top_k" in sent) == (0, 1, 0, False)
    warnings = raw.headers["x-detgate-warnings"]
    assert "top_p forced to 1 (was 0.5)" in warnings and "top_k removed" in warnings and "seed set to 0" in warnings
    assert metric(gw, 'detgate_param_rewrites_total{param="top_p"}') == 1
    # The same request as it was sent upstream is the same key: a hit.
    same = client(gw.url).chat.completions.with_raw_response.create(model="fake/m1", messages=MESSAGES, temperature=0,
                                                                    top_p=1, seed=0)
    assert same.headers["x-detgate-cache"] == "hit" and "x-detgate-warnings" not in same.headers


def test_reject_mode_names_the_parameter_and_the_header_beats_config(upstream, gateway):
    fake, url = upstream
    gw = gateway(upstreams=fake_upstream(url, mode="reject"))
    body = {**CHAT, "top_p": 0.5, "temperature": 0, "seed": 1}
    reply = post(gw.url, "/v1/chat/completions", body)
    assert reply.status == 400 and reply.json()["error"]["param"] == "top_p"
    assert reply.json()["error"]["code"] == "nondeterministic_parameter"
    # The same bytes with another x-detgate-mode: the memo of prepared requests must not answer for them.
    assert post(gw.url, "/v1/chat/completions", body, {"x-detgate-mode": "enforce"}).status == 200
    assert fake.calls[0][1]["top_p"] == 1
    reply = post(gw.url, "/v1/chat/completions", body, {"x-detgate-mode": "sometimes"})
    assert reply.status == 400 and reply.json()["error"]["param"] == "x-detgate-mode"


def test_off_mode_passes_the_request_through_untouched(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    reply = post(gw.url, "/v1/chat/completions", {**CHAT, "top_p": 0.5}, {"x-detgate-mode": "off"})
    assert reply.status == 200 and "x-detgate-warnings" not in reply.headers
    assert fake.calls[0][1] == {"model": "m1", "messages": CHAT["messages"], "top_p": 0.5}


def test_a_user_defined_profile_from_config(upstream, gateway):
    fake, url = upstream
    gw = gateway(profiles=[{"name": "tiny-zero", "zero_temperature": 1e-6, "seed": 7}],
                 upstreams=fake_upstream(url, profile="tiny-zero"))
    reply = post(gw.url, "/v1/chat/completions", CHAT)
    assert reply.status == 200 and (fake.calls[0][1]["temperature"], fake.calls[0][1]["seed"]) == (1e-6, 7)


@pytest.mark.parametrize("settings, complaint", [
    ({"upstreams": [{"name": "a", "url": "http://127.0.0.1:1/v1", "profile": "nope"}]}, "unknown profile 'nope'"),
    ({"profiles": [{"name": "openai"}]}, "is built in"),
    ({"strategies": {"m*": {"vote": 3, "extractor": {"regex": "("}}}}, "does not compile"),
    ({"strategies": {"m*": {"schema": "nope"}}}, "no schema named 'nope'"),
    ({"schemas": {"bad": {"type": 5}}}, "not a valid JSON schema"),
])
def test_bad_rules_refuse_to_start(settings, complaint):
    from pydantic import ValidationError

    from gateway.config import Settings

    with pytest.raises(ValidationError, match=complaint):
        Settings.model_validate(settings)


def test_votes_and_schemas_do_not_apply_to_embeddings(upstream, gateway):
    gw = gateway()
    for header in ("x-detgate-vote", "x-detgate-schema"):
        reply = post(gw.url, "/v1/embeddings", {"model": "fake/e1", "input": "hi"}, {header: "3"})
        assert reply.status == 400 and reply.json()["error"]["param"] == header
