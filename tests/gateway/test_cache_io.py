"""`detgate cache export|import`: the golden-record workflow end to end with real processes
(record through `detgate serve`, export, flush Redis, import, replay byte for byte), and
what import refuses."""
from __future__ import annotations

import os
import subprocess
import sys

import orjson
import redis

from gw_http import CHAT, REPO, SECRET, post, serve_args

REQUESTS = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "Stream it."}], "stream": True}),
    ("/v1/completions", {"model": "fake/m1", "prompt": "Once upon a time"}),
    ("/v1/embeddings", {"model": "fake/e1", "input": "golden"}),
]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)


def flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    client.close()


def record(url: str) -> list[bytes]:
    replies = [post(url, path, body) for path, body in REQUESTS]
    assert all(r.status == 200 and r.cache == "miss" for r in replies)
    return [r.body for r in replies]


def test_export_flush_import_replay_is_byte_identical(upstream, redis_url, gateway_process, tmp_path):
    fake, url = upstream
    recorder = gateway_process(serve_args(url, redis_url))
    recorded = record(recorder.url)
    recorder.stop()
    golden = tmp_path / "golden.jsonl"
    exported = cli("cache", "export", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert exported.returncode == 0, exported.stderr
    assert "exported 4 entries" in exported.stdout
    lines = golden.read_bytes().splitlines()
    keys = [orjson.loads(line)["key"] for line in lines]
    assert len(lines) == 4 and keys == sorted(keys)
    again = tmp_path / "again.jsonl"
    assert cli("cache", "export", str(again), "--redis-url", redis_url, "--secret", SECRET).returncode == 0
    assert again.read_bytes() == golden.read_bytes()  # a stable file: diffs show only real changes

    flush(redis_url)
    imported = cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert imported.returncode == 0, imported.stderr
    assert "imported 4 entries" in imported.stdout

    calls = len(fake.calls)
    replay = gateway_process(serve_args(url, redis_url, "--mode", "replay"))
    replies = [post(replay.url, path, body) for path, body in REQUESTS]
    assert [r.cache for r in replies] == ["hit"] * 4
    assert [r.body for r in replies] == recorded
    assert len(fake.calls) == calls


def test_rotated_namespaces_travel_with_the_entries(upstream, redis_url, gateway_process, tmp_path):
    fake, url = upstream
    client = redis.Redis.from_url(redis_url)
    client.hset("detgate:ledger:epochs", "fake/m1", 3)  # as if `rotate` had moved m1's keys twice
    recorder = gateway_process(serve_args(url, redis_url))
    recorded = record(recorder.url)
    recorder.stop()
    golden = tmp_path / "golden.jsonl"
    assert cli("cache", "export", str(golden), "--redis-url", redis_url, "--secret", SECRET).returncode == 0
    assert orjson.loads(golden.read_bytes().splitlines()[0]) == {"epochs": {"fake/m1": 3}}

    flush(redis_url)
    client.hset("detgate:ledger:epochs", "fake/m1", 1)  # an older namespace is raised, never a newer one lowered
    imported = cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert imported.returncode == 0 and "imported 4 entries" in imported.stdout, imported.stdout + imported.stderr
    assert client.hget("detgate:ledger:epochs", "fake/m1") == b"3"
    client.close()
    calls = len(fake.calls)
    replay = gateway_process(serve_args(url, redis_url, "--mode", "replay"))
    replies = [post(replay.url, path, body) for path, body in REQUESTS]
    assert [r.cache for r in replies] == ["hit"] * 4 and [r.body for r in replies] == recorded
    assert len(fake.calls) == calls


def test_import_refuses_entries_it_cannot_vouch_for(upstream, redis_url, gateway_process, tmp_path):
    _, url = upstream
    recorder = gateway_process(serve_args(url, redis_url, "--near-cache-ttl-s", "0"))  # sees the import at once
    original = post(recorder.url, "/v1/chat/completions", CHAT)
    golden = tmp_path / "golden.jsonl"
    assert cli("cache", "export", str(golden), "--redis-url", redis_url, "--secret", SECRET).returncode == 0
    [line] = golden.read_bytes().splitlines()
    record_ = orjson.loads(line)
    edited = orjson.loads(record_["entry"]["body"])
    edited["choices"][0]["message"]["content"] = "An answer edited by hand."
    record_["entry"]["body"] = orjson.dumps(edited).decode()
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(orjson.dumps(record_) + b"\n" + b"not json\n" + b'{"key": "x"}\n')

    flush(redis_url)
    foreign = cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", "another-secret")
    assert foreign.returncode == 1 and "rejected 1" in foreign.stdout and "MAC" in foreign.stdout
    refused = cli("cache", "import", str(tampered), "--redis-url", redis_url, "--secret", SECRET)
    assert refused.returncode == 1 and "imported 0 entries" in refused.stdout and "rejected 3" in refused.stdout
    assert "line 2" in refused.stdout and "line 3" in refused.stdout
    assert redis.Redis.from_url(redis_url).dbsize() == 0  # nothing half-written

    resealed = cli("cache", "import", str(tampered), "--redis-url", redis_url, "--secret", SECRET, "--reseal")
    assert resealed.returncode == 1 and "imported 1 entries" in resealed.stdout  # the two broken lines still refused
    served = post(recorder.url, "/v1/chat/completions", CHAT)
    assert served.cache == "hit" and served.key == original.key
    assert served.json()["choices"][0]["message"]["content"] == "An answer edited by hand."


def test_cache_commands_need_a_shared_store_and_its_secret(tmp_path, redis_url):
    no_store = cli("cache", "export", str(tmp_path / "x.jsonl"))
    assert no_store.returncode == 2 and "needs --redis-url" in no_store.stderr
    no_secret = cli("cache", "import", str(tmp_path / "x.jsonl"), "--redis-url", redis_url)
    assert no_secret.returncode == 2 and "needs --secret" in no_secret.stderr
    missing = cli("cache", "import", str(tmp_path / "missing.jsonl"), "--redis-url", redis_url, "--secret", SECRET)
    assert missing.returncode == 2 and "missing.jsonl" in missing.stderr
    assert not (tmp_path / "x.jsonl").exists()
