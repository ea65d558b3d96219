"""Canaries: `detgate probe` as a real subprocess, and the schedule inside a gateway,
against a fake provider whose answer to the canary's prompt changes mid-run."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson

from gateway.apis import SURFACES
from gateway.ops.canary import answer_digest
from gateway.state import METRICS
from gw_http import REPO, SECRET, get

HELLO = {"name": "hello", "model": "m1", "upstream": "fake",
         "body": {"messages": [{"role": "user", "content": "Say hello."}]}}


def write_config(path, upstream_url: str, redis_url: str | None, canary_toml: str = "") -> str:
    lines = [f'upstreams = ["fake={upstream_url}"]', f'secret = "{SECRET}"']
    if redis_url:
        lines.append(f'redis_url = "{redis_url}"')
    lines.append(canary_toml or '[[canaries]]\nname = "hello"\nmodel = "m1"\nupstream = "fake"\n'
                                'body = { messages = [{ role = "user", content = "Say hello." }] }')
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def probe(config: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway", "probe", "--config", config], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)


def row(output: str, canary: str) -> list[str]:
    return next(line.split() for line in output.splitlines() if line.startswith(canary + " "))


def test_the_digest_ignores_what_differs_on_every_call():
    one = {"id": "a", "created": 1, "system_fingerprint": "x", "usage": {"total_tokens": 3},
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]}
    message = one["choices"][0]["message"]
    renamed = {**message, "tool_calls": [{**message["tool_calls"][0], "id": "call_2"}]}
    two = {**one, "id": "b", "created": 2, "choices": [{**one["choices"][0], "message": renamed}]}
    other = {**one, "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}]}
    digest = answer_digest(SURFACES["chat.completions"], orjson.dumps(one))
    assert digest == answer_digest(SURFACES["chat.completions"], orjson.dumps(two))
    assert digest != answer_digest(SURFACES["chat.completions"], orjson.dumps(other))
    text = {"choices": [{"text": "a"}]}
    assert answer_digest(SURFACES["completions"], orjson.dumps(text)) != answer_digest(SURFACES["completions"], orjson.dumps(
        {"choices": [{"text": "b"}]}))
    assert answer_digest(SURFACES["embeddings"], orjson.dumps({"data": [{"embedding": [0.5]}]})) != \
        answer_digest(SURFACES["embeddings"], orjson.dumps({"data": [{"embedding": [0.25]}]}))


def test_probe_records_then_matches_then_catches_a_changed_answer(upstream, redis_url, tmp_path):
    fake, url = upstream
    config = write_config(tmp_path / "detgate.toml", url, redis_url)
    fake.behaviour.answer = "Hello there."
    first = probe(config)
    assert first.returncode == 0, first.stderr
    assert row(first.stdout, "hello")[:3] == ["hello", "fake/m1", "recorded"]
    second = probe(config)
    assert second.returncode == 0 and row(second.stdout, "hello")[2] == "match"
    body = fake.calls[-1][1]
    assert body["temperature"] == 0 and "stream" not in body  # de-randomized, and never streamed
    fake.behaviour.answer = "Hi!"
    third = probe(config)
    assert third.returncode == 1
    changed = row(third.stdout, "hello")
    assert changed[2] == "mismatch" and changed[4] == row(first.stdout, "hello")[3]  # expected: the first digest
    assert len(fake.calls) == 3  # canaries never answer from the cache


def test_probe_reports_an_upstream_failure_and_a_pinned_digest(upstream, tmp_path):
    fake, url = upstream
    fake.behaviour.answer = "Hello there."
    digest = answer_digest(SURFACES["chat.completions"], orjson.dumps({"choices": [{"message": {"content": "Hello there."}}]}))
    canaries = (f'[[canaries]]\nname = "pinned"\nmodel = "m1"\nexpect = "{digest}"\n'
                'body = { messages = [{ role = "user", content = "Say hello." }] }\n'
                '[[canaries]]\nname = "broken"\nmodel = "m1"\nroute = "completions"\nbody = { prompt = "x" }')
    config = write_config(tmp_path / "detgate.toml", url, None, canaries)
    fake.behaviour.fail_status, fake.behaviour.fail_times = 400, 1  # the first call (pinned's) fails, not retried
    failed = probe(config)
    assert failed.returncode == 1 and row(failed.stdout, "pinned")[2] == "error"
    assert "upstream answered 400" in failed.stdout
    fine = probe(config)
    assert fine.returncode == 0, fine.stdout
    assert row(fine.stdout, "pinned")[2] == "match" and row(fine.stdout, "broken")[2] == "recorded"


def test_probe_without_canaries_says_what_to_add(upstream, tmp_path):
    _, url = upstream
    config = tmp_path / "detgate.toml"
    config.write_text(f'upstreams = ["fake={url}"]\n')
    done = probe(str(config))
    assert done.returncode == 2 and "no canaries configured" in done.stderr


def test_the_schedule_notices_a_changed_answer(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.answer = "Hello there."
    gw = gateway(canaries=[HELLO], canary_interval_s=0.05)
    registry = gw.app[METRICS].registry

    def status() -> dict:
        return get(gw.url, "/detgate/status").json()["canaries"][0]

    deadline = time.monotonic() + 10
    while status()["result"] not in ("recorded", "match"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert registry.get_sample_value("detgate_canary_status", {"canary": "hello"}) == 1
    fake.behaviour.answer = "Hi!"
    while status()["result"] != "mismatch":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert registry.get_sample_value("detgate_canary_status", {"canary": "hello"}) == 0
    assert registry.get_sample_value("detgate_drift_events_total",
                                     {"upstream": "fake", "model": "m1", "kind": "canary"}) >= 1
    events = get(gw.url, "/detgate/status").json()["drift_events"]
    assert events[0]["kind"] == "canary" and events[0]["canary"] == "hello" and events[0]["epoch"] is None


def test_replicas_sharing_redis_take_turns_at_the_schedule(upstream, gateway, redis_url):
    fake, _ = upstream
    fake.behaviour.answer = "Hello there."
    interval, seconds = 0.1, 3.0
    replicas = [gateway(canaries=[HELLO], canary_interval_s=interval, redis_url=redis_url) for _ in range(3)]
    time.sleep(seconds)
    probes = sum(1 for _, body in fake.calls if body.get("messages") == HELLO["body"]["messages"])
    # One replica alone wakes about seconds / interval = 30 times; three without turns would probe ~90 times.
    assert seconds / (1.2 * interval) - 5 <= probes <= seconds / (0.8 * interval) + 3, probes
    ran = [get(gw.url, "/detgate/status").json()["canaries"][0]["result"] for gw in replicas]
    assert set(ran) <= {"recorded", "match"}, ran
