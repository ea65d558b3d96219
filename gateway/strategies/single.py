"""How a cache miss becomes one complete entry, and the upstream call it is made of.

A strategy is an async callable (call, client, feed) -> Entry that raises UpstreamError
when it cannot produce an answer worth storing. `single` makes one upstream call; every
other spec runs vote_strategy.choose. The spec's name is part of the cache key.
"""
from __future__ import annotations

from dataclasses import dataclass

from gateway.config import UpstreamConfig
from gateway.cache.entry import Entry, from_body, from_events
from gateway.errors import UpstreamError
from gateway.cache.feed import Feed
from gateway.strategies.spec import SINGLE, StrategySpec
from gateway.upstream.client import UpstreamClient


@dataclass(frozen=True)
class Call:
    route: str
    upstream: UpstreamConfig
    body: dict  # exactly what the upstream is sent
    authorization: str | None
    stream: bool  # the client wants a stream
    spec: StrategySpec = SINGLE  # what a miss runs; anything but SINGLE runs vote_strategy.choose


async def single(call: Call, client: UpstreamClient, feed: Feed) -> Entry:
    """One upstream call. A stream is pushed to `feed` event by event as it arrives."""
    if not call.stream:
        payload = await client.post_json(call.upstream, call.route, call.body, call.authorization)
        return from_body(call.route, payload)
    events = []
    async for data in client.stream(call.upstream, call.route, call.body, call.authorization):
        events.append(data)
        feed.push(data)
    if not events:
        raise UpstreamError.broken_stream(call.upstream.name, "no events before [DONE]")
    return from_events(call.route, events)
