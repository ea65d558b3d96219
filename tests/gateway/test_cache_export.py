"""Export vouches for what it exports (issue 22 §6): a golden round trip on a real Redis is
lossless, byte for byte, for entries of every surface and every kind an entry can hold
(streams, usage, tool calls, audio, vote records, TTLs); entries this secret cannot vouch
for, or this gateway cannot serve, are skipped and counted by why, so the file always
imports (exit 0)."""
from __future__ import annotations

import secrets

import orjson
import redis

from gateway.cache.entry import ENTRY_VERSION, Entry, Sealer, encode, now_in_ms
from gateway.cache.redis_store import entry_name
from gateway.policy.keys import KEY_PREFIX, entry_mac
from claude_http import BODY as CLAUDE, WEATHER, upstreams
from gw_http import CHAT, SECRET, post
from test_cache_io import cli, flush

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
# One recorded request per kind of entry: (path, body, headers). Each surface adds its
# own here (T4: the Responses API, T5: Anthropic Messages), and the round trip covers it.
GOLDEN = [
    ("/v1/chat/completions", CHAT, {}),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "Stream it."}], "stream": True,
                              "stream_options": {"include_usage": True}}, {}),
    ("/v1/chat/completions", {**CHAT, "tools": TOOLS, "tool_choice": "required", "stream": True}, {}),
    ("/v1/chat/completions", {**CHAT, "modalities": ["text", "audio"], "stream": True,
                              "audio": {"voice": "alloy", "format": "pcm16"}}, {}),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "Vote on it."}]},
     {"x-detgate-vote": "3"}),
    ("/v1/completions", {"model": "fake/m1", "prompt": ["Alpha:", "Beta:"], "n": 2, "logprobs": 1}, {}),
    ("/v1/embeddings", {"model": "fake/e1", "input": ["golden", "answers"]}, {}),
    ("/v1/responses", {"model": "fake/m1", "input": "Golden."}, {}),
    ("/v1/responses", {"model": "fake/m1", "input": "Stream it.", "stream": True}, {}),
    ("/v1/responses", {"model": "fake/m1", "input": "Search it.", "stream": True,
                       "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}]}, {}),
    ("/v1/responses", {"model": "fake/m1", "input": "Think it.", "reasoning": {"effort": "low"},
                       "include": ["reasoning.encrypted_content"], "stream": True}, {}),
    ("/v1/responses", {"model": "fake/m1", "input": "Shape it.", "text": {"format": {
        "type": "json_schema", "name": "shape", "schema": {"type": "object", "properties": {"b": {"type": "string"},
                                                                                          "a": {"type": "integer"}}}}}},
     {}),
    ("/v1/responses", {"model": "fake/m1", "input": "Vote on it."}, {"x-detgate-vote": "3"}),
    ("/v1/messages", CLAUDE, {}),
    ("/v1/messages", {**CLAUDE, "system": "Stream it.", "stream": True}, {}),
    ("/v1/messages", {**CLAUDE, "tools": [WEATHER], "tool_choice": {"type": "any"}, "stream": True}, {}),
    ("/v1/messages", {**CLAUDE, "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024},
                      "stream": True}, {}),
    ("/v1/messages", {**CLAUDE, "system": "Vote on it."}, {"x-detgate-vote": "3"}),
]


def stored(redis_url: str) -> dict[bytes, tuple[bytes, int]]:
    """Every entry in Redis: name -> (value, ms it has left, -1 for none)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return {name: (client.get(name), client.pttl(name)) for name in client.keys("detgate:e:*")}
    finally:
        client.close()


def test_a_golden_round_trip_is_lossless_byte_for_byte(upstream, claude, gateway, redis_url, tmp_path):
    fake, _ = upstream
    recorder = gateway(redis_url=redis_url, near_cache_ttl_s=0, model_ttl_s={"e1*": 3600},
                       upstreams=upstreams(upstream, claude))
    recorded = [post(recorder.url, path, body, headers) for path, body, headers in GOLDEN]
    assert [r.status for r in recorded] == [200] * len(GOLDEN), [r.body[:200] for r in recorded]
    before = stored(redis_url)
    assert any(left > 0 for _, left in before.values())  # the embeddings' entries carry a TTL
    golden = tmp_path / "golden.jsonl"
    exported = cli("cache", "export", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert exported.returncode == 0 and f"exported {len(before)} entries" in exported.stdout, exported.stdout
    assert "skipped" not in exported.stdout

    flush(redis_url)
    imported = cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert imported.returncode == 0 and f"imported {len(before)} entries" in imported.stdout, imported.stdout
    after = stored(redis_url)
    assert {name: value for name, (value, _) in after.items()} == {name: value for name, (value, _) in before.items()}
    for name, (_, left) in before.items():  # an entry keeps the TTL it has left, no more
        assert (after[name][1] == -1) if left == -1 else (0 < after[name][1] <= left)

    calls = len(fake.calls) + len(claude[0].calls)
    replay = gateway(redis_url=redis_url, mode="replay", upstreams=upstreams(upstream, claude))
    replies = [post(replay.url, path, body, headers) for path, body, headers in GOLDEN]
    assert [r.cache for r in replies] == ["hit"] * len(GOLDEN)
    assert [r.body for r in replies] == [r.body for r in recorded]  # live misses included
    assert len(fake.calls) + len(claude[0].calls) == calls


def _plant(client: redis.Redis, key: str, value: bytes, px: int | None = None) -> None:
    client.set(entry_name(key), value, px=px)


def _key() -> str:
    return KEY_PREFIX + secrets.token_hex(32)


def test_export_skips_what_this_secret_cannot_vouch_for_and_the_file_imports(upstream, gateway, redis_url, tmp_path):
    recorder = gateway(redis_url=redis_url)
    assert post(recorder.url, "/v1/chat/completions", CHAT).status == 200
    assert post(recorder.url, "/v1/embeddings", {"model": "fake/e1", "input": "x"}).status == 200
    secret = SECRET.encode()
    entry = Entry(b'{"object": "chat.completion"}', None, "m")
    client = redis.Redis.from_url(redis_url)
    key = _key()
    _plant(client, key, Sealer(b"the secret before").seal(key, entry))  # left by an earlier secret
    old = orjson.dumps({"v": ENTRY_VERSION - 1, "model": "m", "body": "{}", "sse": None})
    key = _key()
    _plant(client, key, entry_mac(secret, key, old).encode() + old)  # an older gateway's entry, sealed right
    key = "dg1:" + secrets.token_hex(32)
    _plant(client, key, Sealer(secret).seal(key, entry))  # a key of the older key schema
    key = _key()
    stale = encode(Entry(b"{}", None, "m", expires_ms=now_in_ms() - 1000))
    _plant(client, key, entry_mac(secret, key, stale).encode() + stale, px=60_000)  # past its own end
    key = _key()
    _plant(client, key, entry_mac(secret, key, b'{"v": 2}').encode() + b'{"v": 2}')  # sealed, but no entry
    client.close()

    golden = tmp_path / "golden.jsonl"
    exported = cli("cache", "export", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert exported.returncode == 0, exported.stderr
    assert "exported 2 entries" in exported.stdout and "skipped 5" in exported.stdout
    for why in ("1 sealed under another secret", "1 of another entry version", "1 of an older key schema",
                "1 past their TTL", "1 unreadable"):
        assert why in exported.stdout, exported.stdout
    flush(redis_url)
    imported = cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", SECRET)
    assert imported.returncode == 0 and "imported 2 entries" in imported.stdout, imported.stdout
    assert "rejected" not in imported.stdout


def test_import_skips_an_entry_past_its_ttl_and_reseal_keeps_every_byte(redis_url, tmp_path):
    secret = SECRET.encode()
    fresh_key, stale_key = _key(), _key()
    fresh = encode(Entry(b'{"a": 1}', None, "m", meta={"vote": {"votes": "2/3"}}, expires_ms=now_in_ms() + 600_000))
    fresh = orjson.dumps({**orjson.loads(fresh), "later": "a field a newer gateway wrote"})  # kept, byte for byte
    stale = encode(Entry(b'{"a": 2}', None, "m", expires_ms=now_in_ms() - 1))
    golden = tmp_path / "golden.jsonl"
    golden.write_bytes(b"".join(b'{"entry":' + raw + b',"key":"' + key.encode() + b'","mac":"'
                                + entry_mac(b"another secret", key, raw).encode() + b'"}\n'
                                for key, raw in ((fresh_key, fresh), (stale_key, stale))))
    resealed = cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", SECRET, "--reseal")
    assert resealed.returncode == 0 and "imported 1 entries" in resealed.stdout, resealed.stdout
    assert "skipped 1: 1 past their TTL" in resealed.stdout
    client = redis.Redis.from_url(redis_url)
    assert client.get(entry_name(fresh_key)) == entry_mac(secret, fresh_key, fresh).encode() + fresh
    assert 590_000 < client.pttl(entry_name(fresh_key)) <= 600_000 and client.get(entry_name(stale_key)) is None
    client.close()
