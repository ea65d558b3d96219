"""Key rules through the gateway: a recorded Claude Code or Codex turn replays on another day
and after another run's timings; normal mode keeps a new day a new question; user rules from
the TOML config; the rules that fired in x-detgate-warnings and the access log. Gateways in
record and replay modes share one real Redis."""
from __future__ import annotations

import time

import anthropic
import orjson
import pytest

from agent_bodies import DATA, TODAY, TOMORROW, claude_request, claude_run, codex_request, codex_run
from claude_http import sdk, upstreams
from gw_http import CHAT, client, post
from gateway.config import load


def _claude(api, headers: dict, **request) -> tuple[str, str, str]:
    """(x-detgate-cache, the warnings, the stream's bytes) of one streamed turn."""
    raw = api.beta.messages.with_raw_response.create(**request, stream=True, extra_headers=headers)
    return raw.headers["x-detgate-cache"], raw.headers.get("x-detgate-warnings", ""), raw.http_response.read()


def _codex(api, **request) -> tuple[str, str, bytes]:
    raw = api.responses.with_raw_response.create(**request, stream=True)
    return raw.headers["x-detgate-cache"], raw.headers.get("x-detgate-warnings", ""), raw.http_response.read()


def test_a_recorded_claude_code_turn_replays_the_next_day(upstream, claude, gateway, redis_url):
    fake, _ = claude
    shared = {"upstreams": upstreams(upstream, claude), "redis_url": redis_url, "near_cache_ttl_s": 0}
    record, replay = sdk(gateway(mode="record", **shared).url), sdk(gateway(mode="replay", **shared).url)
    today_headers, today_session = claude_run()
    recorded = _claude(record, today_headers, **claude_request(TODAY, today_session, DATA))
    assert recorded[0] == "miss" and "claude-code:date" in recorded[1]
    tomorrow_headers, tomorrow_session = claude_run()
    replayed = _claude(replay, tomorrow_headers, **claude_request(TOMORROW, tomorrow_session, DATA))
    assert replayed[0] == "hit" and replayed[2] == recorded[2]
    assert "key rules left values out of the key, sent upstream unchanged: claude-code:date" in replayed[1]
    assert len(fake.calls) == 1
    # Forwarded unchanged: the upstream read today's date as the agent wrote it.
    assert f"Today's date is {TODAY.isoformat()}." in fake.calls[0][1]["messages"][0]["content"][0]["text"]


def test_a_recorded_codex_turn_replays_with_another_days_date_and_timings(upstream, gateway, redis_url):
    fake, _ = upstream
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    record, replay = client(gateway(mode="record", **shared).url), client(gateway(mode="replay", **shared).url)
    today_run, tomorrow_run = codex_run(), codex_run()
    recorded = _codex(record, **codex_request(TODAY, today_run, "0.1", DATA))
    replayed = _codex(replay, **codex_request(TOMORROW, tomorrow_run, "0.0", DATA))
    assert (recorded[0], replayed[0]) == ("miss", "hit")
    # The same bytes, but for the prompt_cache_key each reader is shown as it sent it.
    assert replayed[2].replace(tomorrow_run["session"].encode(), b"<session>") == \
        recorded[2].replace(today_run["session"].encode(), b"<session>")
    assert "codex:current-date, codex:wall-time" in replayed[1]
    sent = fake.calls[0][1]["input"]
    assert f"<current_date>{TODAY.isoformat()}</current_date>" in sent[2]["content"]  # one text part is its text
    assert sent[-1]["output"][0]["text"] == "Script completed\nWall time 0.1 seconds\nOutput:\n"
    assert len(fake.calls) == 1


def test_normal_mode_keys_a_new_day_as_a_new_question_unless_told(upstream, claude, gateway):
    fake, _ = claude
    for agent_key_rules, second in (("auto", "miss"), ("on", "hit")):
        api = sdk(gateway(upstreams=upstreams(upstream, claude), agent_key_rules=agent_key_rules).url)
        headers, session = claude_run()
        first = _claude(api, headers, **claude_request(TODAY, session))
        assert first[0] == "miss" and ("claude-code:date" in first[1]) == (agent_key_rules == "on")
        assert _claude(api, headers, **claude_request(TOMORROW, session))[0] == second


def test_only_a_recognised_agent_gets_the_built_in_rules(upstream, claude, gateway, redis_url):
    shared = {"upstreams": upstreams(upstream, claude), "redis_url": redis_url, "near_cache_ttl_s": 0}
    record, replay = sdk(gateway(mode="record", **shared).url), sdk(gateway(mode="replay", **shared).url)
    headers, session = claude_run()
    headers["user-agent"] = "my-app/1.0"
    assert "claude-code:date" not in _claude(record, headers, **claude_request(TODAY, session))[1]
    with pytest.raises(anthropic.APIStatusError, match="(?i)replay"):  # another day is another question for it
        replay.beta.messages.create(**claude_request(TOMORROW, session), stream=True, extra_headers=headers)


RULES_TOML = """
mode = "record"

[[key_rules]]
name = "request-id"
path = "messages[*].x_request_id"

[[key_rules]]
name = "build-stamp"
pattern = 'build \\d+'
replace = "build <n>"
"""


def test_user_rules_from_the_toml_config_are_part_of_the_key_schema(upstream, gateway, redis_url, tmp_path):
    fake, _ = upstream
    config = tmp_path / "detgate.toml"
    config.write_text(RULES_TOML)
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    settings = load(str(config), {}, {}).model_dump(include={"key_rules", "mode"})
    ruled = gateway(**settings, **shared)
    unruled = gateway(mode="replay", **shared)

    def ask(build: int, request_id: str) -> dict:
        return {**CHAT, "messages": [{"role": "user", "content": f"Summarize build {build}.",
                                      "x_request_id": request_id}]}

    first = post(ruled.url, "/v1/chat/completions", ask(17, "r-1"))
    assert first.cache == "miss" and "request-id, build-stamp" in first.headers["x-detgate-warnings"]
    sent = fake.calls[0][1]["messages"][0]
    assert sent["content"] == "Summarize build 17." and sent["x_request_id"] == "r-1"
    replay = gateway(**{**settings, "mode": "replay"}, **shared)
    again = post(replay.url, "/v1/chat/completions", ask(18, "r-2"))
    assert again.cache == "hit" and again.key == first.key and again.body == first.body
    # A gateway without those rules never shares the entry, not even for the very same request.
    assert post(unruled.url, "/v1/chat/completions", ask(17, "r-1")).json()["error"]["code"] == "replay_miss"
    # A request no rule touches keys as it always did: with or without rules configured.
    plain = post(ruled.url, "/v1/chat/completions", CHAT)
    assert "x-detgate-warnings" not in plain.headers or "key rules" not in plain.headers["x-detgate-warnings"]
    assert post(unruled.url, "/v1/chat/completions", CHAT).key == plain.key


def test_warnings_reach_the_access_log_with_paths_and_the_rule_to_write(upstream, gateway_process, tmp_path):
    _, url = upstream
    config = tmp_path / "detgate.toml"
    config.write_text('[[key_rules]]\nname = "trace"\npath = "x_trace.started_ms"\n')
    gw = gateway_process(["--upstream", f"fake={url}", "--log-level", "INFO", "--mode", "record",
                          "--config", str(config)])
    run = codex_run()
    request = codex_request(TODAY, run, "0.1", DATA)
    body = {**{k: v for k, v in request.items() if k not in ("extra_body", "extra_headers")},
            **request["extra_body"], "x_trace": {"started_ms": int(time.time() * 1000),
                                                 "trace_id": run["turn"]}}
    reply = post(gw.url, "/v1/responses", body, request["extra_headers"])
    assert reply.status == 200
    gw.stop()
    lines = [orjson.loads(line) for line in gw.process.stderr.read().splitlines()]
    access = [line for line in lines if line["logger"] == "detgate.access" and line["route"] == "responses"]
    assert len(access) == 1 and access[0]["warnings"] == reply.headers["x-detgate-warnings"]
    warnings = access[0]["warnings"]
    assert "key rules left values out of the key, sent upstream unchanged: codex:current-date, codex:wall-time, trace" \
        in warnings
    # The scan names the value the rules left in, with its path and the rule that would cover it.
    assert "(uuid; first at x_trace.trace_id[0:36])" in warnings
    assert 'key_rules = [{name = "uuid", path = "x_trace.trace_id"}]' in warnings
