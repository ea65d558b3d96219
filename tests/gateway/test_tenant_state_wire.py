"""Proxied requests go to an upstream of the wire they speak: the anthropic SDK's
`models.list()` reaches the Anthropic upstream and the openai SDK's the OpenAI one,
whatever order the upstreams are configured in; an Anthropic request no Anthropic
upstream proxies is refused in Anthropic's shape (issue 44)."""
from __future__ import annotations

import anthropic
import pytest

from tenant_pair import KEYS, anthropic_as, openai_as, upstreams


@pytest.mark.parametrize("order", [1, -1])
def test_each_sdk_lists_its_own_wires_models(upstream, claude, gateway, order):
    gw = gateway(upstreams=upstreams(upstream, claude)[::order], tenants={n: {"key": k} for n, k in KEYS.items()})
    assert [m.id for m in anthropic_as(gw, "alice").models.list()] == ["claude-fake-1"]
    assert [m.id for m in openai_as(gw, "alice").models.list()] == ["fake-model"]


def test_an_anthropic_request_never_reaches_an_openai_upstream(upstream, claude, gateway):
    gw = gateway(upstreams=upstreams(upstream, claude)[:1])
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0).models.list()
    assert caught.value.body["error"]["type"] == "permission_error"
