"""Fingerprint drift: a fake provider whose system_fingerprint changes mid-run, with the
`keep` and `rotate` policies, in one gateway and across replicas sharing a Redis."""
from __future__ import annotations

import time

from gateway.ops.drift import DriftEvent, DriftMonitor, namespaced
from gateway.ops.ledger import MemoryLedger
from gateway.ops.metrics import Metrics
from gateway.state import METRICS
from gateway.ops.watch import DRIFT
from gw_http import CHAT, post, sse_payloads

OTHER = {**CHAT, "messages": [{"role": "user", "content": "Say goodbye."}]}


def warnings(reply) -> str:
    return reply.headers.get("x-detgate-warnings", "")


def drift_events(server, kind: str = "fingerprint", model: str = "m1") -> float:
    value = server.app[METRICS].registry.get_sample_value(
        "detgate_drift_events_total", {"upstream": "fake", "model": model, "kind": kind})
    return value or 0.0


async def test_only_a_new_fingerprint_is_drift():
    metrics = Metrics()
    monitor = DriftMonitor(MemoryLedger(), "keep", b"s", metrics)
    assert await monitor.observe("up", "m", "fp_a") is None  # the first one is a record, not a change
    assert await monitor.observe("up", "m", "fp_a") is None
    event = await monitor.observe("up", "m", "fp_b")
    assert (event.old, event.new, event.kind, event.epoch) == ("fp_a", "fp_b", "fingerprint", None)
    assert "fp_a to fp_b" in event.warning() and "kept" in event.warning()
    # Providers serve from several builds at once: one seen before coming back is no news.
    assert await monitor.observe("up", "m", "fp_a") is None
    assert await monitor.observe("up", "other", "fp_b") is None  # another model's first
    assert await monitor.observe("up", "m", None) is None
    assert metrics.registry.get_sample_value("detgate_drift_events_total",
                                             {"upstream": "up", "model": "m", "kind": "fingerprint"}) == 1


async def test_replicas_count_one_change_once():
    ledger = MemoryLedger()
    a, b = (DriftMonitor(ledger, "keep", b"s", Metrics()) for _ in range(2))
    await a.observe("up", "m", "fp_a")
    assert await b.observe("up", "m", "fp_a") is None
    assert (await a.observe("up", "m", "fp_b")).new == "fp_b"
    assert await b.observe("up", "m", "fp_b") is None  # a filed it first
    assert await b.observe("up", "m", "fp_a") is None


async def test_rotate_moves_only_that_models_keys_to_a_new_namespace():
    monitor = DriftMonitor(MemoryLedger(), "rotate", b"s", Metrics())
    key = "dg1:" + "ab" * 32
    assert monitor.key(key, "up", "m") == key
    await monitor.observe("up", "m", "fp_a")
    event = await monitor.observe("up", "m", "fp_b")
    assert event.epoch == 1 and "new key namespace 1" in event.warning()
    rotated = monitor.key(key, "up", "m")
    assert rotated != key and rotated == namespaced(b"s", key, 1) and len(rotated) == len(key)
    assert monitor.key(key, "up", "other") == key
    assert namespaced(b"other secret", key, 1) != rotated and namespaced(b"s", key, 2) != rotated
    canary = await monitor.record(DriftEvent("canary", "up", "other", "d1", "d2", 0.0, canary="c"))
    assert canary.epoch is None and monitor.key(key, "up", "other") == key  # canaries never rotate


def test_keep_serves_the_cache_and_warns_on_the_answer_that_revealed_the_change(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    first = post(gw.url, "/v1/chat/completions", CHAT)
    assert first.cache == "miss" and "drift" not in warnings(first)
    fake.behaviour.fingerprint = "fp_new_build"
    revealed = post(gw.url, "/v1/chat/completions", OTHER)
    assert revealed.cache == "miss"
    assert "drift: fake/m1 system_fingerprint changed from fp_fake_0001 to fp_new_build" in \
        revealed.headers["x-detgate-warnings"]
    assert drift_events(gw) == 1
    again = post(gw.url, "/v1/chat/completions", CHAT)
    assert (again.cache, again.key, again.body) == ("hit", first.key, first.body)
    third = post(gw.url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "3"}]})
    assert "drift" not in warnings(third)  # told once, not on every answer of the new build
    assert drift_events(gw) == 1 and len(fake.calls) == 3


def test_a_streamed_answer_is_watched_and_warned_about_too(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    post(gw.url, "/v1/chat/completions", CHAT)
    fake.behaviour.fingerprint = "fp_streamed"
    streamed = post(gw.url, "/v1/chat/completions", {**OTHER, "stream": True})
    assert streamed.status == 200 and sse_payloads(streamed.body)[-1] == b"[DONE]"
    # Its headers left with the first event, before the ledger was asked: this replica's memory tells.
    assert "system_fingerprint changed from fp_fake_0001 to fp_streamed" in warnings(streamed)
    assert drift_events(gw) == 1
    later = post(gw.url, "/v1/chat/completions",
                 {**CHAT, "stream": True, "messages": [{"role": "user", "content": "3"}]})
    assert later.status == 200 and "drift" not in warnings(later)


def test_rotate_answers_afresh_from_the_new_model(upstream, gateway):
    fake, _ = upstream
    gw = gateway(drift_policy="rotate")
    first = post(gw.url, "/v1/chat/completions", CHAT)
    fake.behaviour.fingerprint = "fp_new_build"
    revealed = post(gw.url, "/v1/chat/completions", OTHER)
    assert "new key namespace 1" in revealed.headers["x-detgate-warnings"]
    fresh = post(gw.url, "/v1/chat/completions", CHAT)
    assert fresh.cache == "miss" and fresh.key != first.key and fresh.body != first.body
    assert b"fp_new_build" in fresh.body
    again = post(gw.url, "/v1/chat/completions", CHAT)
    assert (again.cache, again.key, again.body) == ("hit", fresh.key, fresh.body)
    assert gw.app[DRIFT].epochs == {"fake/m1": 1}


def test_replicas_rotate_together_through_redis(upstream, gateway, redis_url):
    fake, _ = upstream
    a = gateway(redis_url=redis_url, drift_policy="rotate", drift_sync_s=0.05, near_cache_ttl_s=0)
    b = gateway(redis_url=redis_url, drift_policy="rotate", drift_sync_s=0.05, near_cache_ttl_s=0)
    first = post(a.url, "/v1/chat/completions", CHAT)
    assert post(b.url, "/v1/chat/completions", CHAT).body == first.body
    fake.behaviour.fingerprint = "fp_new_build"
    assert "new key namespace 1" in post(a.url, "/v1/chat/completions", OTHER).headers["x-detgate-warnings"]
    deadline = time.monotonic() + 5
    while b.app[DRIFT].epochs != {"fake/m1": 1}:
        assert time.monotonic() < deadline, "replica b never read the new epoch"
        time.sleep(0.02)
    on_b = post(b.url, "/v1/chat/completions", CHAT)
    assert on_b.cache == "miss" and on_b.body != first.body
    assert post(a.url, "/v1/chat/completions", CHAT).body == on_b.body  # one new namespace, shared
    assert drift_events(a) + drift_events(b) == 1
