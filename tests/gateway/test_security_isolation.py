"""Tenant isolation is the default; sharing entries is an explicit, checked setting."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config import Settings
from gw_http import CHAT, post

KEYS = {"acme": "gw-key-acme", "acme-eu": "gw-key-acme-eu", "globex": "gw-key-globex"}


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def test_only_tenants_configured_to_share_read_each_others_entries(upstream, gateway):
    fake, _ = upstream
    gw = gateway(tenants=KEYS, shared_cache_tenants=["acme", "acme-eu"])
    acme = post(gw.url, "/v1/chat/completions", CHAT, auth("acme"))
    acme_eu = post(gw.url, "/v1/chat/completions", CHAT, auth("acme-eu"))
    globex = post(gw.url, "/v1/chat/completions", CHAT, auth("globex"))
    assert (acme.cache, acme_eu.cache, globex.cache) == ("miss", "hit", "miss")
    assert acme_eu.body == acme.body and acme_eu.key == acme.key
    assert globex.key != acme.key and globex.body != acme.body
    assert len(fake.calls) == 2


@pytest.mark.parametrize("settings, complaint", [
    ({"tenants": {"acme": "k1"}, "shared_cache_tenants": ["acme", "ghost"]}, "ghost"),
    ({"tenants": {"acme": "k1", "s": {"key": "k2", "id": "shared"}, "b": "k3"}, "shared_cache_tenants": ["acme", "b"]},
     "'s' with id 'shared'"),
])
def test_sharing_settings_that_would_leak_are_refused(settings, complaint):
    with pytest.raises(ValidationError, match=complaint):
        Settings.model_validate(settings)
