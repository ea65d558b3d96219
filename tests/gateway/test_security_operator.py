"""/metrics and /detgate/status can be the operator's alone: with an operator token set,
they answer only to it, and no tenant key (nor the token on the API) stands in for another."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config import Settings
from gw_http import CHAT, assert_openai_error, get, post, serve_args

TOKEN = "op-token-4b1f0c"
TENANTS = {"acme": "gw-key-acme"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("path", ["/metrics", "/detgate/status"])
def test_operator_endpoints_answer_only_to_the_operator_token(upstream, gateway, path):
    gw = gateway(tenants=TENANTS, operator_token=TOKEN)
    for headers in ({}, bearer(""), bearer(TENANTS["acme"]), bearer(TOKEN + "x"), bearer(TOKEN[:-1]),
                    {"Authorization": TOKEN}):
        assert_openai_error(get(gw.url, path, headers), 401, code="invalid_operator_token")
    allowed = get(gw.url, path, bearer(TOKEN))
    assert allowed.status == 200 and allowed.headers["x-detgate-cache"] == "bypass"
    assert get(gw.url, "/healthz").status == 200


def test_the_operator_token_is_no_tenant_key(upstream, gateway):
    fake, _ = upstream
    gw = gateway(tenants=TENANTS, operator_token=TOKEN)
    assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT, bearer(TOKEN)), 401, code="invalid_api_key")
    assert_openai_error(get(gw.url, "/v1/models", bearer(TOKEN)), 401, code="invalid_api_key")
    assert fake.calls == []


def test_without_a_token_metrics_stay_open_and_status_asks_for_a_tenant_key(upstream, gateway):
    gw = gateway(tenants=TENANTS)
    assert get(gw.url, "/metrics").status == 200
    assert_openai_error(get(gw.url, "/detgate/status"), 401, code="invalid_api_key")
    assert get(gw.url, "/detgate/status", bearer(TENANTS["acme"])).status == 200


@pytest.mark.parametrize("token, complaint", [("", "operator token"), ("  ", "operator token"),
                                              (" op", "operator token"), ("gw-key-acme", "also a tenant's")])
def test_settings_refuse_an_unusable_operator_token(token, complaint):
    with pytest.raises(ValidationError, match=complaint):
        Settings.model_validate({"tenants": TENANTS, "operator_token": token})


def test_serve_takes_the_token_from_the_environment(upstream, redis_url, gateway_process):
    _, url = upstream
    gw = gateway_process(serve_args(url, redis_url), env={"DETGATE_OPERATOR_TOKEN": TOKEN})
    assert_openai_error(get(gw.url, "/metrics"), 401, code="invalid_operator_token")
    metrics = get(gw.url, "/metrics", bearer(TOKEN))
    assert metrics.status == 200 and b"detgate_requests_total" in metrics.body
