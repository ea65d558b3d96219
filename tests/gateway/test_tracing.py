"""Traces through the gateway, exported over OTLP/HTTP to a real receiver started by the test,
which decodes the protobuf: the client's W3C trace context is continued, one server span per
request with child spans for the lookup, the single-flight lock or wait, each upstream attempt,
each vote member and each schema retry, and the upstream is sent our attempt as its parent."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from fakes.loopback import LoopbackServer
from fakes.noisy_upstream import INVALID, NoisyUpstream
from fakes.otlp_receiver import OtlpReceiver
from gateway.app import TRACING
from gateway.cache.traced_store import TracedStore
from gateway.state import GATEWAY
from gw_http import CHAT, post
from noisy_gw import ANSWER_SCHEMA, QUESTION, noisy_gateway

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "tracestate": "vendor=abc"}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}


def collected(receiver: OtlpReceiver, done, timeout_s: float = 15.0) -> list[dict]:
    """The spans the receiver decoded, once `done(spans)` holds (the exporter sends in batches)."""
    deadline = time.monotonic() + timeout_s
    while not done(receiver.spans):
        assert time.monotonic() < deadline, [s["name"] for s in receiver.spans]
        time.sleep(0.05)
    return list(receiver.spans)


def children(spans, parent) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in spans:
        if s["parent_id"] == parent["span_id"]:
            out.setdefault(s["name"], []).append(s)
    return out


def servers(spans) -> list[dict]:
    return [s for s in spans if s["name"] == "POST /v1/chat/completions"]


@pytest.fixture
def collector():
    """A receiver on loopback: (its URL, the receiver). Asked for before `gateway`, so that it
    outlives the gateways that export to it."""
    receiver = OtlpReceiver()
    with LoopbackServer(receiver.app()) as server:
        yield server.url, receiver


def test_a_miss_and_a_hit_continue_the_clients_trace(collector, upstream, gateway):
    fake, _ = upstream
    url, receiver = collector
    gw = gateway(otlp_endpoint=url)
    assert isinstance(gw.app[GATEWAY].store, TracedStore)
    first = post(gw.url, "/v1/chat/completions", CHAT, TRACEPARENT)
    second = post(gw.url, "/v1/chat/completions", CHAT, TRACEPARENT)
    assert (first.headers["x-detgate-cache"], second.headers["x-detgate-cache"]) == ("miss", "hit")
    spans = collected(receiver, lambda s: len(servers(s)) == 2 and any(x["kind"] == 3 for x in s))

    miss, hit = sorted(servers(spans), key=lambda s: s["start"])
    for span in (miss, hit):
        assert span["trace_id"] == TRACE_ID and span["parent_id"] == CLIENT_SPAN and span["kind"] == 2
        assert span["service"] == "detgate-gateway" and span["trace_state"] == "vendor=abc"
        a = span["attributes"]
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "m1"
        assert a["detgate.upstream"] == "fake" and a["http.response.status_code"] == 200
        assert a["detgate.key_prefix"] == first.headers["x-detgate-key"][:16]
    assert (miss["attributes"]["detgate.cache"], hit["attributes"]["detgate.cache"]) == ("miss", "hit")

    under_miss = children(spans, miss)
    assert under_miss["detgate.cache.lookup"][0]["attributes"]["detgate.cache.found"] is False
    assert under_miss["detgate.singleflight.lock"][0]["attributes"]["detgate.filled_elsewhere"] is False
    (attempt,) = under_miss["chat m1"]
    assert attempt["kind"] == 3   # CLIENT
    assert attempt["attributes"]["gen_ai.request.model"] == "m1"
    assert attempt["attributes"]["http.response.status_code"] == 200
    assert "detgate.cache.store" in under_miss
    # The upstream was told our attempt is its parent, in the client's trace.
    (sent, state), = fake.traceparents
    assert sent == f"00-{TRACE_ID}-{attempt['span_id']}-01" and state == "vendor=abc"

    under_hit = children(spans, hit)
    assert under_hit["detgate.cache.lookup"][0]["attributes"]["detgate.cache.found"] is True
    assert set(under_hit) == {"detgate.cache.lookup"}   # a hit calls nothing upstream


def test_vote_members_schema_retries_and_a_coalesced_wait_are_spans(collector):
    fake = NoisyUpstream(by_seed={0: INVALID, 1: "yes"})
    url, receiver = collector
    with noisy_gateway(fake, otlp_endpoint=url) as gw:
        body = {"model": "m1", "messages": QUESTION, "response_format": SCHEMA_FORMAT}
        assert post(gw.url, "/v1/chat/completions", body).headers["x-detgate-attempts"] == "2"
        voted = post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": [{"role": "user", "content": "v"}]},
                     {"x-detgate-vote": "3"})
        assert voted.status == 200

        async def twice():
            async with aiohttp.ClientSession() as session:
                async def one():
                    async with session.post(gw.url + "/v1/chat/completions", data=orjson.dumps(
                            {"model": "m1", "messages": [{"role": "user", "content": "together"}]})) as r:
                        return r.headers["x-detgate-cache"]
                return await asyncio.gather(one(), one())
        fake.delay_s = 0.3
        caches = asyncio.run(twice())
        assert sorted(caches) == ["coalesced", "miss"]
        spans = collected(receiver, lambda s: len(servers(s)) == 4 and any(
            x["name"] == "detgate.singleflight.wait" for x in s))

    schema, vote, *pair = sorted(servers(spans), key=lambda s: s["start"])
    assert schema["attributes"]["detgate.attempts"] == 2
    tries = sorted(children(spans, schema)["detgate.schema.attempt"], key=lambda s: s["start"])
    assert [t["attributes"]["detgate.attempt"] for t in tries] == [1, 2]
    assert all("chat m1" in children(spans, t) for t in tries)   # each retry holds its upstream attempt
    members = children(spans, vote)["detgate.vote.member"]
    assert len(members) >= 2 and len({m["attributes"]["detgate.seed"] for m in members}) == len(members)
    assert vote["attributes"]["detgate.votes"]
    waits = [s for s in spans if s["name"] == "detgate.singleflight.wait"]
    assert len(waits) == 1 and waits[0]["parent_id"] in {p["span_id"] for p in pair}


def test_off_by_default_nothing_is_installed_and_nothing_forwarded(upstream, gateway):
    fake, _ = upstream
    gw = gateway()
    assert TRACING not in gw.app and not isinstance(gw.app[GATEWAY].store, TracedStore)
    assert post(gw.url, "/v1/chat/completions", CHAT, TRACEPARENT).status == 200
    assert fake.traceparents == [(None, None)]
