"""Agent sessions (issue 40 §3, §4): a tool loop recorded through `--mode record` replays
through `--mode replay` when its tool outputs change (each served turn warns with the
paths that differ), a replay miss is a 400 that names the nearest recording and where it
differs, sessions survive export -> flush -> import, and stay within their tenant. The
official SDKs against gateways on one real Redis, in front of fakes that answer every call
differently."""
from __future__ import annotations

import secrets

import anthropic
import httpx2
import openai
import orjson
import pytest
import redis

from gateway.cache.redis_store import entry_name
from gateway.cache.session_store import MemorySessions
from gateway.state import GATEWAY
from claude_http import HEADERS, MODEL, sdk, upstreams
from gw_http import SECRET
from test_cache_io import cli, flush

SHELL = {"name": "shell", "description": "Run a command.",
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
PROMPT = "List the files, then read one."
TENANTS = {"alpha": "gk-alpha", "beta": "gk-beta"}


def gateways(gateway, upstream, claude, redis_url, **settings):
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0, "upstreams": upstreams(upstream, claude), **settings}
    return gateway(mode="record", **shared), gateway(mode="replay", **shared)


def tool_loop(client: anthropic.Anthropic, prompt: str = PROMPT, run: str = "") -> list:
    """Three turns: two tool uses, whose outputs hold `run` (a timestamp in a real `ls -la`),
    then the answer. Each run is a new Claude Code session. (raw replies, messages sent)."""
    headers = {"x-claude-code-session-id": secrets.token_hex(8)}
    messages = [{"role": "user", "content": prompt}]
    replies = []
    for turn, choice in enumerate(({"type": "any"}, {"type": "any"}, {"type": "auto"})):
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=messages, tools=[SHELL],
                                                       tool_choice=choice, extra_headers=headers)
        replies.append(raw)
        message = raw.parse()
        messages = messages + [{"role": "assistant", "content": [b.to_dict() for b in message.content]}]
        for block in message.content:
            if block.type == "tool_use":
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": block.id, "content": f"turn {turn} output {run}"}]})
    return replies


def test_a_tool_loop_replays_with_changed_tool_outputs(upstream, claude, gateway, redis_url):
    record, replay = gateways(gateway, upstream, claude, redis_url)
    recorded = tool_loop(sdk(record.url), run="Nov 28 13:56")
    assert [r.headers["x-detgate-cache"] for r in recorded] == ["miss"] * 3
    calls = len(claude[0].calls)

    replayed = tool_loop(sdk(replay.url), run="Nov 29 09:12")
    assert [r.headers["x-detgate-cache"] for r in replayed] == ["hit"] * 3
    assert [r.http_response.content for r in replayed] == [r.http_response.content for r in recorded]
    assert "session replay" not in replayed[0].headers["x-detgate-warnings"]  # the same first request: an exact hit
    second, third = (r.headers["x-detgate-warnings"] for r in replayed[1:])
    assert "session replay: turn 1 of session" in second and second.endswith("at messages[2].content[0].content")
    assert "turn 2 of session" in third
    assert third.endswith("at messages[2].content[0].content, messages[4].content[0].content")
    assert len(claude[0].calls) == calls  # replay never calls the upstream

    same = tool_loop(sdk(replay.url), run="Nov 28 13:56")  # the recorded outputs: exact hits, no warning
    assert all(r.headers["x-detgate-cache"] == "hit" and "session replay" not in r.headers["x-detgate-warnings"]
               for r in same)


def streamed_loop(client: anthropic.Anthropic, run: str) -> list[tuple[dict, anthropic.types.Message]]:
    """The tool loop as Claude Code sends it: streamed. (headers, final message) per turn."""
    headers = {"x-claude-code-session-id": secrets.token_hex(8)}
    messages, turns = [{"role": "user", "content": PROMPT}], []
    for turn, choice in enumerate(({"type": "any"}, {"type": "any"}, {"type": "auto"})):
        with client.messages.stream(model=MODEL, max_tokens=64, messages=messages, tools=[SHELL], tool_choice=choice,
                                    extra_headers=headers) as stream:
            message = stream.get_final_message()
            turns.append((dict(stream.response.headers), message))
        messages = messages + [{"role": "assistant", "content": [b.to_dict() for b in message.content]}]
        messages += [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id,
                                                   "content": f"turn {turn} output {run}"}]}
                     for b in message.content if b.type == "tool_use"]
    return turns


def test_a_streamed_tool_loop_is_recorded_live_and_replays(upstream, claude, gateway, redis_url):
    record, replay = gateways(gateway, upstream, claude, redis_url)
    recorded = streamed_loop(sdk(record.url), run="13:56")
    assert [h["x-detgate-cache"] for h, _ in recorded] == ["miss"] * 3
    replayed = streamed_loop(sdk(replay.url), run="09:12")
    assert [h["x-detgate-cache"] for h, _ in replayed] == ["hit"] * 3
    assert [m.to_dict() for _, m in replayed] == [m.to_dict() for _, m in recorded]
    assert replayed[2][0]["x-detgate-warnings"].endswith("messages[2].content[0].content, messages[4].content[0].content")


def test_a_replay_miss_is_a_400_naming_the_nearest_recording_and_the_path(upstream, claude, gateway, redis_url):
    record, replay = gateways(gateway, upstream, claude, redis_url)
    tool_loop(sdk(record.url))
    with pytest.raises(anthropic.BadRequestError) as caught:
        tool_loop(sdk(replay.url), prompt="List the files, then delete one.")
    error = caught.value.body["error"]
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error"
    message = error["message"]
    assert "replay_miss" in message and "nearest recording is turn 0 of session" in message
    assert ('first difference is at messages[0].content: recorded "List the files, then read one.", '
            'sent "List the files, then delete one."') in message
    assert "detgate cache diff" in message and len(message) < 1200

    # A later turn that differs beyond its tool outputs is compared within its own session.
    headers = {"x-detgate-session": "ci-run"}
    client = sdk(record.url)
    first = client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": PROMPT}],
                                   tools=[SHELL], tool_choice={"type": "any"}, extra_headers=headers)
    use = first.content[-1]
    second = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": [b.to_dict() for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b"}]}]
    client.messages.create(model=MODEL, max_tokens=64, messages=second, tools=[SHELL], extra_headers=headers)
    second[2]["content"].append({"type": "text", "text": "Hurry."})
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(replay.url).messages.create(model=MODEL, max_tokens=64, messages=second, tools=[SHELL],
                                        extra_headers=headers)
    message = caught.value.body["error"]["message"]
    assert "nearest recording is turn 1 of its own session" in message
    assert 'at messages[2].content[1]: recorded (absent), sent {"text":"Hurry.","type":"text"}' in message


def test_sessions_survive_export_flush_import(upstream, claude, gateway, redis_url, tmp_path):
    record, replay = gateways(gateway, upstream, claude, redis_url)
    recorded = tool_loop(sdk(record.url), run="first")
    golden = tmp_path / "golden.jsonl"
    exported = cli("cache", "export", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert exported.returncode == 0 and "exported 3 entries and 1 session (3 turns)" in exported.stdout, exported
    flush(redis_url)
    with pytest.raises(anthropic.BadRequestError):
        tool_loop(sdk(replay.url), run="second")
    imported = cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert imported.returncode == 0 and "imported 3 entries and 1 session (3 turns)" in imported.stdout, imported
    replayed = tool_loop(sdk(replay.url), run="second")
    assert [r.headers["x-detgate-cache"] for r in replayed] == ["hit"] * 3
    assert [r.http_response.content for r in replayed] == [r.http_response.content for r in recorded]
    assert "session replay" in replayed[2].headers["x-detgate-warnings"]

    again = tmp_path / "again.jsonl"
    assert cli("cache", "export", str(again), "--redis-url", redis_url, "--secret", SECRET).returncode == 0
    assert again.read_bytes() == golden.read_bytes()  # an imported session is stored byte for byte

    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(golden.read_bytes().replace(b"turn 0 output first", b"turn 0 output forged"))
    refused = cli("cache", "import", str(tampered), "--redis-url", redis_url, "--secret", SECRET)
    assert refused.returncode == 1 and "fails its MAC check" in refused.stdout, refused.stdout


def test_a_tenant_never_replays_another_tenants_session(upstream, claude, gateway, redis_url):
    record, replay = gateways(gateway, upstream, claude, redis_url, tenants=TENANTS)
    tool_loop(sdk(record.url, api_key="gk-alpha"), run="alpha")
    with pytest.raises(anthropic.BadRequestError) as caught:
        tool_loop(sdk(replay.url, api_key="gk-beta"), run="beta")
    assert "No request recorded in a session is near it" in caught.value.body["error"]["message"]
    replayed = tool_loop(sdk(replay.url, api_key="gk-alpha"), run="beta")
    assert [r.headers["x-detgate-cache"] for r in replayed] == ["hit"] * 3


def test_a_responses_tool_loop_replays_and_a_miss_is_not_retried(upstream, gateway, redis_url):
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    record, replay = gateway(mode="record", **shared), gateway(mode="replay", **shared)
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {
        "command": {"type": "string"}}, "required": ["command"]}}]

    sent = []

    def run(base: str, output: str, prompt: str = "What is here?") -> list:
        counted = httpx2.Client(event_hooks={"request": [sent.append]})
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=3, http_client=counted)
        items: list = [{"role": "user", "content": prompt}]
        replies = []
        for _ in range(2):
            raw = client.responses.with_raw_response.create(model="fake/m1", input=items, tools=tools, store=False,
                                                            extra_headers={"session-id": secrets.token_hex(8)})
            replies.append(raw)
            for out in raw.parse().output:
                if out.type == "function_call":
                    items += [out.to_dict(), {"type": "function_call_output", "call_id": out.call_id, "output": output}]
        return replies

    recorded = run(record.url, "total 8 -rw-r--r-- 13:56 a.txt")
    replayed = run(replay.url, "total 8 -rw-r--r-- 09:12 a.txt")
    assert [r.headers["x-detgate-cache"] for r in replayed] == ["hit", "hit"]
    assert replayed[1].http_response.content == recorded[1].http_response.content
    assert replayed[1].headers["x-detgate-warnings"].endswith("at input[2].output")

    sent.clear()
    with pytest.raises(openai.BadRequestError) as caught:
        run(replay.url, "x", prompt="What was here?")
    assert len(sent) == 1  # the SDK does not retry it (it would a 5xx, 429 or 408)
    assert caught.value.status_code == 400 and caught.value.code == "replay_miss"
    assert caught.value.param == "input"  # one user message is keyed as the plain string
    assert '"What is here?"' in caught.value.message and '"What was here?"' in caught.value.message


def test_cache_diff_says_whether_replay_answers_and_prints_every_difference(upstream, claude, gateway, redis_url,
                                                                              tmp_path):
    record, _ = gateways(gateway, upstream, claude, redis_url)
    client = sdk(record.url)
    prompt = [{"role": "user", "content": PROMPT}]
    first = client.messages.create(model=MODEL, max_tokens=64, messages=prompt, tools=[SHELL],
                                   tool_choice={"type": "any"})
    use = first.content[-1]
    turn = prompt + [{"role": "assistant", "content": [b.to_dict() for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a\nb"}]}]
    client.messages.create(model=MODEL, max_tokens=64, messages=turn, tools=[SHELL])
    config = tmp_path / "detgate.toml"
    config.write_text(f'[[upstreams]]\nname = "fake"\nurl = "{upstream[1]}"\n[[upstreams]]\nname = "claude"\n'
                      f'url = "{claude[1]}"\nprofile = "anthropic"\napi_key = "sk-op"\n')

    def diff(body: dict) -> tuple[int, str]:
        path = tmp_path / "body.json"
        path.write_bytes(orjson.dumps(body))
        done = cli("cache", "diff", str(path), "--config", str(config), "--redis-url", redis_url, "--secret", SECRET,
                   "-H", f"anthropic-version: {HEADERS['anthropic-version']}", "-H", "x-api-key: unused")
        assert done.returncode in (0, 1), done.stderr
        return done.returncode, done.stdout

    body = {"model": MODEL, "max_tokens": 64, "messages": turn, "tools": [SHELL]}
    status, out = diff(body)
    assert status == 0 and "replay answers it: this exact request is recorded" in out
    turn[2]["content"][0]["content"] = "a\nc"
    status, out = diff(body)
    assert status == 0 and "answers it with turn 1 of session" in out
    assert "messages[2].content[0].content:\n    --- recorded\n    +++ sent" in out and "    -b\n    +c" in out
    turn[0]["content"] = "List the files, then read " + "every one. " * 20
    status, out = diff(body)
    assert status == 1 and "replay misses it; the nearest recording is turn 1 of" in out
    assert f"messages[0].content:\n  - recorded: {orjson.dumps(PROMPT).decode()}\n  + sent:     " in out
    assert "every one. " * 20 in out  # whole, not shortened


def test_a_matching_turn_whose_answer_is_gone_says_so(upstream, claude, gateway, redis_url):
    record, replay = gateways(gateway, upstream, claude, redis_url)
    recorded = tool_loop(sdk(record.url), run="first")
    client = redis.Redis.from_url(redis_url)
    client.delete(entry_name(recorded[1].headers["x-detgate-key"]))
    client.close()
    with pytest.raises(anthropic.BadRequestError) as caught:
        tool_loop(sdk(replay.url), run="second")
    assert "Turn 1 of session" in caught.value.message and "answer is no longer stored" in caught.value.message


def test_the_in_process_store_keeps_a_recorded_session(upstream, claude, gateway):
    recorder = gateway(mode="record", upstreams=upstreams(upstream, claude))
    recorded = tool_loop(sdk(recorder.url))
    assert all("session turn not recorded" not in r.headers["x-detgate-warnings"] for r in recorded)
    sessions = recorder.app[GATEWAY].sessions
    assert isinstance(sessions, MemorySessions) and sessions.nbytes > 0


def test_a_chat_completions_tool_loop_replays_with_a_changed_tool_message(upstream, gateway, redis_url):
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    record, replay = gateway(mode="record", **shared), gateway(mode="replay", **shared)
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]

    def run(base: str, output: str) -> list:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        messages: list = [{"role": "user", "content": "What is here?"}]
        first = client.chat.completions.with_raw_response.create(model="fake/m1", messages=messages, tools=tools,
                                                                 tool_choice="required")
        call = first.parse().choices[0].message
        messages += [call.to_dict(), {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": output}]
        return [first, client.chat.completions.with_raw_response.create(model="fake/m1", messages=messages, tools=tools)]

    recorded = run(record.url, "a.txt 13:56")
    replayed = run(replay.url, "a.txt 09:12")
    assert [r.headers["x-detgate-cache"] for r in replayed] == ["hit", "hit"]
    assert replayed[1].http_response.content == recorded[1].http_response.content
    assert replayed[1].headers["x-detgate-warnings"].endswith("at messages[2].content")


def test_a_replay_run_that_strays_is_told_the_turn_of_the_recording_it_follows(upstream, claude, gateway, redis_url):
    record, replay = gateways(gateway, upstream, claude, redis_url)
    tool_loop(sdk(record.url), run="13:56")
    tool_loop(sdk(record.url), prompt="List the files, then read two.", run="13:57")  # another recording
    client, headers = sdk(replay.url), {"x-claude-code-session-id": "a-new-run"}
    messages = [{"role": "user", "content": PROMPT}]
    for turn in range(2):  # an exact hit, then a session hit (its tool output changed)
        message = client.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[SHELL],
                                         tool_choice={"type": "any"}, extra_headers=headers)
        messages += [{"role": "assistant", "content": [b.to_dict() for b in message.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": message.content[-1].id,
                                                   "content": f"turn {turn} output 09:12"}]}]
    messages[-1]["content"].append({"type": "text", "text": "Also count them."})  # beyond tool outputs
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[SHELL], extra_headers=headers)
    assert "nearest recording is turn 2 of the recorded session this run follows" in caught.value.message
    assert "at messages[4].content[1]: recorded (absent)" in caught.value.message
