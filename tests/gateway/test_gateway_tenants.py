"""Tenants: gateway keys pick the tenant, a tenant's entries belong to its id (not its name),
keys are never empty, and in passthrough mode the client's own account answers."""
from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from fakes.account_upstream import AccountUpstream
from fakes.loopback import LoopbackServer
from gateway.config import Settings
from gateway.policy.keys import tenant_from_api_key
from gw_http import CHAT, assert_openai_error, client, post

TENANTS = {"acme": "gw-key-acme", "globex": "gw-key-globex"}
ONLY_CACHED = {"x-detgate-cache-control": "only-if-cached"}


def auth(key: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **more}


@pytest.fixture
def account():
    """A provider whose answers depend on the account (key, organization, project) asking."""
    fake = AccountUpstream()
    with LoopbackServer(fake.app()) as server:
        yield fake, server.url + "/v1"


def test_tenants_are_isolated(upstream, gateway):
    fake, _ = upstream
    gw = gateway(tenants=TENANTS)
    acme = [post(gw.url, "/v1/chat/completions", CHAT, auth("gw-key-acme")) for _ in range(2)]
    globex = post(gw.url, "/v1/chat/completions", CHAT, auth("gw-key-globex"))
    assert [r.cache for r in acme] == ["miss", "hit"]
    assert globex.cache == "miss" and globex.key != acme[0].key and globex.body != acme[0].body
    assert len(fake.calls) == 2
    only = post(gw.url, "/v1/chat/completions", CHAT, auth("gw-key-globex", **ONLY_CACHED))
    assert only.body == globex.body


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Bearer    ", "Basic Z3ctdXNlcjo=", "gw-key-acme",
                                    "Bearer gw-key-acmf", "Bearer gw-key-acme2", "Bearer gw-key-acm"])
def test_a_missing_empty_or_wrong_key_never_authenticates(upstream, gateway, header):
    fake, _ = upstream
    gw = gateway(tenants=TENANTS)
    headers = {} if header is None else {"Authorization": header}
    assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT, headers), 401, code="invalid_api_key")
    assert_openai_error(post(gw.url, "/v1/models", b"", headers), 401, code="invalid_api_key")
    assert fake.calls == []


@pytest.mark.parametrize("tenants", [{"acme": ""}, {"acme": "   "}, {"acme": {"key": "", "refresh": True}},
                                     {"ok": "k1", "acme": " k2"}])
def test_settings_refuse_an_empty_key_naming_the_tenant(tenants):
    with pytest.raises(ValidationError, match="tenant 'acme'"):
        Settings.model_validate({"tenants": tenants})


def test_serve_refuses_an_empty_key_at_start(gateway_process):
    with pytest.raises(RuntimeError, match="tenant 'acme' has an empty API key"):
        gateway_process(["--tenant", "acme=", "--tenant", "globex=gw-key-globex"])


def test_a_name_given_to_a_new_key_never_reads_the_old_keys_entries(upstream, gateway, redis_url):
    fake, _ = upstream
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    before = gateway(tenants={"acme": "gw-key-acme-2024"}, **shared)
    old = post(before.url, "/v1/chat/completions", CHAT, auth("gw-key-acme-2024"))
    # The operator hands the name "acme" to someone else's new key (short form: no id).
    after = gateway(tenants={"acme": "gw-key-acme-2025"}, **shared)
    assert post(after.url, "/v1/chat/completions", CHAT, auth("gw-key-acme-2025", **ONLY_CACHED)).status == 404
    new = post(after.url, "/v1/chat/completions", CHAT, auth("gw-key-acme-2025"))
    assert new.cache == "miss" and new.key != old.key and new.body != old.body
    assert_openai_error(post(after.url, "/v1/chat/completions", CHAT, auth("gw-key-acme-2024")), 401)
    assert len(fake.calls) == 2


def test_a_key_rotated_under_the_same_id_keeps_the_entries(upstream, gateway, redis_url):
    fake, _ = upstream
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    before = gateway(tenants={"acme": {"key": "gw-key-acme-2024", "id": "acme-corp"}}, **shared)
    old = post(before.url, "/v1/chat/completions", CHAT, auth("gw-key-acme-2024"))
    # Renamed and re-keyed, same id: the same namespace.
    after = gateway(tenants={"acme-inc": {"key": "gw-key-acme-2025", "id": "acme-corp"}}, **shared)
    hit = post(after.url, "/v1/chat/completions", CHAT, auth("gw-key-acme-2025", **ONLY_CACHED))
    assert (hit.status, hit.key, hit.body) == (200, old.key, old.body)
    assert_openai_error(post(after.url, "/v1/chat/completions", CHAT, auth("gw-key-acme-2024")), 401)
    assert len(fake.calls) == 1


def test_tenants_with_one_id_are_refused_unless_shared():
    with pytest.raises(ValidationError, match="'a' and 'b' have one id"):
        Settings.model_validate({"tenants": {"a": {"key": "k1", "id": "x"}, "b": {"key": "k2", "id": "x"}}})
    with pytest.raises(ValidationError, match="'c' and 'z' have one id"):
        # An id spelled like another tenant's derived one is the same namespace too.
        derived = Settings.model_validate({"tenants": {"a": "k1"}}).tenants["a"].namespace
        Settings.model_validate({"tenants": {"b": "k1x", "c": {"key": "k2", "id": derived}, "z": "k1"}})


def test_passthrough_forwards_the_client_key_and_splits_tenants_by_it(account, gateway):
    fake, url = account
    gw = gateway(upstreams=[{"name": "acct", "url": url}], passthrough_auth=True)
    a = post(gw.url, "/v1/chat/completions", CHAT, auth("sk-client-a"))
    b = post(gw.url, "/v1/chat/completions", CHAT, auth("sk-client-b"))
    a2 = post(gw.url, "/v1/chat/completions", CHAT, auth("sk-client-a"))
    assert (a.cache, b.cache, a2.cache) == ("miss", "miss", "hit")
    assert a.key != b.key
    assert [s.headers["authorization"] for s in fake.seen] == ["Bearer sk-client-a", "Bearer sk-client-b"]
    assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT), 401, code="missing_api_key")
    assert_openai_error(post(gw.url, "/v1/chat/completions", CHAT, {"Authorization": "Bearer "}), 401,
                        code="missing_api_key")


def test_passthrough_forwards_and_keys_the_clients_organization_and_project(account, gateway):
    """They pick which of the key's organizations and projects answers (model access,
    fine-tunes, quotas): each is its own namespace, and the upstream hears it."""
    fake, url = account
    gw = gateway(upstreams=[{"name": "acct", "url": url}], passthrough_auth=True)
    api = client(gw.url).with_options(api_key="sk-client-a")
    accounts = [api, api.with_options(organization="org-1"), api.with_options(organization="org-2"),
                api.with_options(organization="org-1", project="proj-1")]
    replies = [c.chat.completions.with_raw_response.create(model="acct/m1", messages=CHAT["messages"])
               for c in accounts + accounts]
    assert [r.headers["x-detgate-cache"] for r in replies] == ["miss"] * 4 + ["hit"] * 4
    assert len({r.headers["x-detgate-key"] for r in replies}) == 4
    sent = [(s.headers.get("openai-organization"), s.headers.get("openai-project")) for s in fake.seen]
    assert sent == [(None, None), ("org-1", None), ("org-2", None), ("org-1", "proj-1")]


def test_with_the_operators_key_the_clients_organization_is_neither_sent_nor_keyed(account, gateway):
    fake, url = account
    gw = gateway(upstreams=[{"name": "acct", "url": url, "api_key": "sk-operator"}], tenants=TENANTS)
    api = client(gw.url).with_options(api_key="gw-key-acme")
    replies = [c.chat.completions.with_raw_response.create(model="acct/m1", messages=CHAT["messages"])
               for c in (api, api.with_options(organization="org-theirs", project="proj-theirs"))]
    assert [r.headers["x-detgate-cache"] for r in replies] == ["miss", "hit"]
    (seen,) = fake.seen
    assert seen.headers["authorization"] == "Bearer sk-operator"
    assert "openai-organization" not in seen.headers and "openai-project" not in seen.headers


def test_configured_upstream_key_is_sent(account, gateway, monkeypatch):
    fake, url = account
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-from-env")
    gw = gateway(upstreams=[{"name": "acct", "url": url, "api_key_env": "FAKE_UPSTREAM_KEY"}])
    assert post(gw.url, "/v1/chat/completions", CHAT, auth("client-key")).status == 200
    assert client(gw.url).models.list().data
    assert [s.headers["authorization"] for s in fake.seen] == ["Bearer sk-from-env"] * 2


def test_a_key_sent_alone_keeps_the_namespace_it_always_had():
    """Adding the organization and project to a passthrough tenant's digest left the
    namespace of a key sent without them as it was before."""
    before = "key-" + hashlib.sha256(len(b"detgate/tenant").to_bytes(8, "big") + b"detgate/tenant" + b"sk-abc").hexdigest()[:32]
    assert tenant_from_api_key("sk-abc") == before
    with_org = tenant_from_api_key("sk-abc", (("openai-organization", "org-1"),))
    assert with_org != before != tenant_from_api_key("sk-abc", (("openai-project", "org-1"),)) != with_org
