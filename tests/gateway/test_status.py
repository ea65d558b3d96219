"""GET /detgate/status: fingerprints, canaries, drift events, store and mode."""
from __future__ import annotations

from gw_http import CHAT, get, post


def test_status_reports_fingerprints_drift_store_and_mode(upstream, gateway):
    fake, _ = upstream
    gw = gateway(drift_policy="rotate", canaries=[{"name": "c1", "model": "m1", "body": {"prompt": "x"},
                                                   "route": "completions"}])
    empty = get(gw.url, "/detgate/status")
    assert empty.status == 200 and empty.headers["content-type"].startswith("application/json")
    assert empty.json() == {"mode": "normal", "drift_policy": "rotate",
                            "store": {"kind": "in-process", "healthy": True, "error": None},
                            "fingerprints": [], "canaries": [{"canary": "c1", "result": "not run yet"}],
                            "drift_events": []}
    post(gw.url, "/v1/chat/completions", CHAT)
    fake.behaviour.fingerprint = "fp_two"
    post(gw.url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "Another."}]})
    status = get(gw.url, "/detgate/status").json()
    [row] = status["fingerprints"]
    assert (row["upstream"], row["model"], row["fingerprint"], row["epoch"]) == ("fake", "m1", "fp_two", 1)
    assert [s["fingerprint"] for s in row["seen"]] == ["fp_fake_0001", "fp_two"]
    [event] = status["drift_events"]
    assert {k: event[k] for k in ("kind", "upstream", "model", "old", "new", "epoch")} == {
        "kind": "fingerprint", "upstream": "fake", "model": "m1", "old": "fp_fake_0001", "new": "fp_two", "epoch": 1}


def test_status_is_authenticated_like_the_api(upstream, gateway):
    gw = gateway(tenants={"team": "sk-team"})
    denied = get(gw.url, "/detgate/status")
    assert denied.status == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    assert get(gw.url, "/detgate/status", {"Authorization": "Bearer sk-team"}).status == 200


def test_status_answers_while_redis_is_down(upstream, gateway, own_redis):
    gw = gateway(redis_url=own_redis.url, mode="replay")
    assert get(gw.url, "/detgate/status").json()["store"] == {"kind": "redis", "healthy": True, "error": None}
    own_redis.stop()
    status = get(gw.url, "/detgate/status")
    assert status.status == 200
    body = status.json()
    assert body["mode"] == "replay" and body["store"]["kind"] == "redis" and body["store"]["healthy"] is False
    assert "redis" in body["store"]["error"]
    down = post(gw.url, "/v1/chat/completions", CHAT)  # replay cannot fall back to the upstream
    assert down.status == 503 and down.json()["error"]["code"] == "cache_unavailable"
    assert upstream[0].calls == []
