"""How a cache miss becomes one complete entry, and the upstream call it is made of.

A strategy is an async callable (call, client, feed) -> Entry that raises UpstreamError
when it cannot produce an answer worth storing. `single` makes one upstream call; a
stream whose checks nobody asked to wait for runs checked_stream (live, checked at its
end); every other spec runs voting.choose. The spec's name is part of the cache key.
"""
from __future__ import annotations

from dataclasses import dataclass

from gateway.apis.surface import Surface
from gateway.cache.entry import Entry
from gateway.cache.feed import Feed
from gateway.config import UpstreamConfig
from gateway.strategies.spec import SINGLE, StrategySpec
from gateway.upstream.client import UpstreamClient


@dataclass(frozen=True)
class Call:
    surface: Surface
    upstream: UpstreamConfig
    body: dict  # what the upstream is sent, for a whole answer or a stream as `stream` says
    headers: tuple[tuple[str, str], ...]  # credentials and keyed headers the upstream is sent
    stream: bool  # the client wants a stream
    spec: StrategySpec = SINGLE  # what a miss runs (route/cached.py strategy_for)
    seed: int = 0  # the seed the key carries; sent only where `body` has one (the wire and the model take seeds)

    @property
    def route(self) -> str:
        return self.surface.name


async def single(call: Call, client: UpstreamClient, feed: Feed) -> Entry:
    """One upstream call. A stream is pushed to `feed` frame by frame as it arrives."""
    surface, upstream = call.surface, call.upstream
    if not call.stream:
        payload = await client.post_json(upstream, surface.path, call.body, call.headers)
        return surface.from_body(upstream.name, payload)
    recorder = surface.recorder(upstream.name)
    async for payload in client.stream(upstream, surface.path, call.body, call.headers):
        frame = recorder.push(payload)
        if frame is not None:
            if not feed.events:  # what the first frame said, for the live response's headers
                feed.model, feed.fingerprint = recorder.model, recorder.fingerprint
            feed.push(frame)
    return recorder.finish()
