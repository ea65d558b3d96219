"""An upstream with a provider's profile reads that provider's usual key variable, and the
start-up log names, per upstream, where its credential comes from and never the value:
real `detgate serve` processes, the official clients, fake providers that record headers."""
from __future__ import annotations

import subprocess
import sys

import anthropic
import openai

from gateway.config import UpstreamConfig
from gw_http import REPO

KEY = "sk-test-credential-7f3a"


def _log(proc) -> str:
    proc.stop()
    return proc.process.stderr.read().decode()


def test_a_flag_named_openai_upstream_sends_openai_api_key(gateway_process, upstream):
    fake, url = upstream
    proc = gateway_process(["--upstream", f"openai={url}#openai", "--log-level", "INFO"], {"OPENAI_API_KEY": KEY})
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert fake.authorizations == [f"Bearer {KEY}"]
    log = _log(proc)
    assert "upstream openai" in log and "$OPENAI_API_KEY (the openai profile's default; set)" in log
    assert KEY not in log


def test_an_anthropic_upstream_sends_anthropic_api_key(gateway_process, claude):
    fake, url = claude
    proc = gateway_process(["--upstream", f"claude={url}#anthropic", "--log-level", "INFO"],
                           {"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": "sk-other"})
    client = anthropic.Anthropic(base_url=proc.url, api_key="unused", max_retries=0)
    client.messages.create(model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert fake.headers[-1].get("x-api-key") == KEY
    log = _log(proc)
    assert "$ANTHROPIC_API_KEY (the anthropic profile's default; set)" in log and KEY not in log


def test_a_missing_key_is_a_warning_at_start(gateway_process, upstream):
    _, url = upstream
    env = {"OPENAI_API_KEY": ""}
    proc = gateway_process(["--upstream", f"openai={url}#openai"], env)
    log = _log(proc)   # at --log-level WARNING, so only the warning shows
    assert "upstream openai" in log and "$OPENAI_API_KEY" in log and "NOT SET" in log


def test_the_config_file_can_send_no_key(gateway_process, upstream, tmp_path):
    fake, url = upstream
    config = tmp_path / "detgate.toml"
    config.write_text(f'[[upstreams]]\nname = "openai"\nurl = "{url}"\nprofile = "openai"\napi_key_env = ""\n')
    proc = gateway_process(["--config", str(config), "--log-level", "INFO"], {"OPENAI_API_KEY": KEY})
    openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert fake.authorizations == [None]
    assert "credential from none" in _log(proc)


def test_a_provider_host_gives_the_provider_profile_and_key():
    up = UpstreamConfig(name="default", url="https://api.openai.com/v1")
    assert (up.profile, up.key_env, up.key({"OPENAI_API_KEY": KEY})) == ("openai", "OPENAI_API_KEY", KEY)
    up = UpstreamConfig(name="a", url="https://api.anthropic.com/v1")
    assert (up.profile, up.key_env) == ("anthropic", "ANTHROPIC_API_KEY")
    named = UpstreamConfig(name="b", url="https://api.openai.com/v1", profile="generic-openai-compatible")
    assert named.key_env is None   # a profile given is kept, and a generic one reads no provider's key
    assert UpstreamConfig(name="c", url="http://h/v1", api_key_env="MY_KEY").key({"MY_KEY": "k"}) == "k"


def test_serve_help_names_both_default_upstreams():
    shown = subprocess.run([sys.executable, "-m", "gateway", "serve", "--help"], cwd=REPO, capture_output=True,
                           text=True, timeout=60, env={"PYTHONPATH": str(REPO), "COLUMNS": "200"}).stdout
    flat = " ".join(shown.split())
    assert "openai=https://api.openai.com/v1 with $OPENAI_API_KEY" in flat
    assert "anthropic=https://api.anthropic.com/v1 with $ANTHROPIC_API_KEY for /v1/messages" in flat
