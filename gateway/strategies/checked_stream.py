"""A streamed answer checked at its end: the strategy of a streamed request whose checks its
own tools or response format imply, and nobody asked to wait for (StrategySpec.asked).

The stream goes to the client live, as the upstream sends it: a check cannot hold back
bytes that are already out, and an agent must see its answer as it is written. Once the
stream is complete the answer is validated like attempt 1 of schema-checked retries (the
same seed, the same checks, so the entry is the one a whole-answer request could have
stored). A valid answer is stored; an invalid one has been passed on as streamed and is
marked `rejected`, which keeps it out of the cache (SingleFlight) and says why in the
access log and detgate_schema_attempts_total{result="streamed_invalid"}.
"""
from __future__ import annotations

import dataclasses

import orjson

from gateway.cache.entry import Entry
from gateway.cache.feed import Feed
from gateway.cache.storing import REJECTED
from gateway.strategies.schema_check import summary
from gateway.strategies.single import Call, single
from gateway.upstream.client import UpstreamClient


async def checked_stream(call: Call, client: UpstreamClient, feed: Feed) -> Entry:
    entry = await single(call, client, feed)
    errors = call.surface.problems(orjson.loads(entry.body), call.body, call.spec.schema)
    counted = client.metrics.schema_attempts.labels(str(call.body.get("model", "")), "invalid" if errors else "valid")
    counted.inc()
    meta: dict = {"attempts": 1}
    if errors:
        client.metrics.schema_attempts.labels(str(call.body.get("model", "")), "streamed_invalid").inc()
        meta[REJECTED] = summary(errors)
    return dataclasses.replace(entry, meta=meta)
