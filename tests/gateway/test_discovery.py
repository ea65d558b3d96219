"""An upstream that says what it is: a detgate backend is given the whitebox profile
without configuration, and a profile set in config is never second-guessed."""
from __future__ import annotations

import pytest

from gateway.config import Settings
from gw_http import SECRET, post

REQUEST = {"model": "local/m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "top_p": 0.9,
           "top_k": 40, "seed": 5}


def sent_to_upstream(fake, gateway_process, spec: str) -> dict:
    gateway = gateway_process(["--upstream", spec, "--secret", SECRET])
    assert post(gateway.url, "/v1/chat/completions", REQUEST).status == 200
    return fake.calls[-1][1]


def test_a_backend_that_announces_whitebox_gets_its_sampling_parameters(upstream, gateway_process):
    fake, url = upstream
    fake.behaviour.announce_profile = "whitebox"
    sent = sent_to_upstream(fake, gateway_process, f"local={url}")
    assert (sent["top_k"], sent["top_p"], sent["temperature"]) == (40, 0.9, 0.7)


@pytest.mark.parametrize("announced", [None, "whitebox"])
def test_a_profile_in_the_spec_wins_and_silence_keeps_the_generic_one(upstream, gateway_process, announced):
    fake, url = upstream
    fake.behaviour.announce_profile = announced
    spec = f"local={url}" if announced is None else f"local={url}#generic-openai-compatible"
    sent = sent_to_upstream(fake, gateway_process, spec)
    assert "top_k" not in sent and sent["top_p"] == 1


def test_the_profile_suffix_parses_and_an_unknown_one_refuses_to_start():
    settings = Settings.model_validate({"upstreams": ["local=http://127.0.0.1:1/v1#whitebox"]})
    assert settings.upstreams[0].profile == "whitebox" and settings.upstreams[0].url == "http://127.0.0.1:1/v1"
    with pytest.raises(ValueError, match="unknown profile"):
        Settings.model_validate({"upstreams": ["http://127.0.0.1:1/v1#nope"]})


def test_a_backend_that_answers_later_is_asked_again_and_a_guess_is_never_served(upstream, gateway_process):
    """Started before its backend is ready, the gateway does not settle for the generic profile:
    a request it would rewrite waits, then gets a 503 naming what it would change; once the
    backend answers, the next request learns its profile and is sent as asked."""
    fake, url = upstream
    fake.behaviour.announce_profile = "whitebox"
    fake.behaviour.models_status = 503
    gateway = gateway_process(["--upstream", f"local={url}", "--secret", SECRET])
    refused = post(gateway.url, "/v1/chat/completions", REQUEST)
    assert refused.status == 503 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "upstream_profile_unknown"
    assert "top_k" in error["message"] and "#PROFILE" in error["message"]
    assert not fake.calls   # nothing was sent under the guess
    fake.behaviour.models_status = None
    served = post(gateway.url, "/v1/chat/completions", REQUEST)
    assert served.status == 200
    sent = fake.calls[-1][1]
    assert (sent["top_k"], sent["top_p"], sent["temperature"]) == (40, 0.9, 0.7)
