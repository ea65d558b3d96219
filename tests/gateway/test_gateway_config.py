"""Settings: flag > env > file > default, validated with messages that name the field; routing."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.apis import SURFACES
from gateway.config import Settings, load
from gateway.errors import ApiError
from gateway.policy.routing import route


def test_precedence_flag_env_file_default(tmp_path):
    file = tmp_path / "detgate.toml"
    file.write_text('port = 9001\nhost = "0.0.0.0"\nlock_lease_ms = 5000\n'
                    '[[upstreams]]\nname = "local"\nurl = "http://127.0.0.1:8000/v1/"\nprofile = "whitebox"\nmodels = ["qwen*"]\n'
                    '[tenants]\nacme = "k1"\n')
    env = {"DETGATE_PORT": "9002", "DETGATE_LOCK_LEASE_MS": "7000"}
    settings = load(str(file), env, {"port": 9003, "host": None})
    assert settings.port == 9003  # flag
    assert settings.lock_lease_ms == 7000  # env
    assert settings.host == "0.0.0.0"  # file
    assert settings.max_body_bytes == 8 * 2**20  # default
    [local] = settings.upstreams
    assert (local.name, local.url, local.profile, local.models) == ("local", "http://127.0.0.1:8000/v1", "whitebox", ("qwen*",))
    assert settings.tenants["acme"].key.get_secret_value() == "k1"


def test_env_lists_and_the_openai_default():
    settings = load(None, {"DETGATE_UPSTREAMS": "http://a:1/v1, b=http://b:2/v1", "DETGATE_TENANTS": "x=k1,y=k2"}, {})
    assert [(u.name, u.url) for u in settings.upstreams] == [("default", "http://a:1/v1"), ("b", "http://b:2/v1")]
    assert set(settings.tenants) == {"x", "y"}
    openai, claude = Settings().upstreams
    assert (openai.name, openai.url, openai.api_key_env) == ("openai", "https://api.openai.com/v1", "OPENAI_API_KEY")
    assert (claude.name, claude.url, claude.api_key_env, claude.profile) == (
        "anthropic", "https://api.anthropic.com/v1", "ANTHROPIC_API_KEY", "anthropic")


@pytest.mark.parametrize("values, field", [
    ({"port": "eighty"}, "port"),
    ({"upstreams": ["ftp://x"]}, "url"),
    ({"upstreams": ["a=http://x/v1", "a=http://y/v1"]}, "unique"),
    ({"passthrough_auth": True, "tenants": {"a": "k"}}, "exclude"),
    ({"tenants": {"a": "k", "b": "k"}}, "share"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_settings_name_the_problem(values, field):
    with pytest.raises(ValidationError, match=field):
        Settings.model_validate(values)


def test_routing_never_leaves_the_configured_upstreams():
    settings = Settings.model_validate({"upstreams": [
        "main=http://main/v1", {"name": "local", "url": "http://local/v1", "models": ["llama-*"]}]})
    ups, profiles, chat = settings.upstreams, settings.rules.profiles, SURFACES["chat.completions"]
    assert [(u.name, m) for u, m in (route(ups, profiles, chat, "local/gpt-x"), route(ups, profiles, chat, "llama-3"),
                                    route(ups, profiles, chat, "gpt-4o"), route(ups, profiles, chat, "http://evil/v1"),
                                    route(ups, profiles, chat, "nosuch/model"))] == [
        ("local", "gpt-x"), ("local", "llama-3"), ("main", "gpt-4o"), ("main", "http://evil/v1"), ("main", "nosuch/model")]


def test_routing_picks_an_upstream_that_serves_the_surface():
    settings = Settings.model_validate({"upstreams": [
        {"name": "oa", "url": "http://oa/v1", "models": ["gpt-*"]},
        {"name": "claude", "url": "http://claude/v1", "profile": "anthropic"},
        {"name": "both", "url": "http://both/v1", "models": ["glm-*"], "surfaces": ["chat.completions", "messages"]}]})
    ups, profiles = settings.upstreams, settings.rules.profiles
    chat, messages = SURFACES["chat.completions"], SURFACES["messages"]
    assert route(ups, profiles, messages, "claude-x")[0].name == "claude"  # the first that serves it
    assert route(ups, profiles, chat, "claude-x")[0].name == "oa"
    assert route(ups, profiles, messages, "glm-4")[0].name == "both"
    for model in ("gpt-4o", "oa/gpt-4o"):
        with pytest.raises(ApiError) as refused:
            route(ups, profiles, messages, model)
        assert refused.value.status == 400 and "'oa'" in refused.value.message
    with pytest.raises(ApiError) as none:
        route(ups[:1], profiles, messages, "claude-x")
    assert none.value.status == 404
    with pytest.raises(ValidationError, match="surfaces"):
        Settings.model_validate({"upstreams": [{"name": "x", "url": "http://x/v1", "surfaces": ["chat"]}]})


def test_cli_refuses_bad_settings_with_a_message(tmp_path):
    import subprocess
    import sys

    from gw_http import REPO
    file = tmp_path / "bad.toml"
    file.write_text('port = 70000\n')
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(file)], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "port" in done.stderr and "Traceback" not in done.stderr


def test_the_gateway_never_imports_torch():
    import subprocess
    import sys

    from gw_http import REPO
    # Every module of the package, not a list that a new module could slip past.
    code = ("import importlib, pkgutil, sys, gateway\n"
            "for m in pkgutil.walk_packages(gateway.__path__, 'gateway.'):\n"
            "    if m.name != 'gateway.__main__':\n"
            "        importlib.import_module(m.name)\n"
            "assert not {'torch', 'local_backend'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
