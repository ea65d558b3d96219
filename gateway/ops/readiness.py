"""/readyz: whether this gateway can answer requests now, apart from /healthz (it is alive).

Ready means: the store answers, or the policy lets the gateway answer without it
(--cache-failure fail-open: ready but degraded, answers uncached), and at least one upstream
is usable: its circuit is not open and, where it needs a key from the environment, the key is
set. The same check runs every few seconds in the background, so the gauges
(detgate_ready, detgate_store_up, detgate_upstream_usable) and the alerts on them follow the
truth between probes too. As Kubernetes and Envoy use them: a failing /readyz takes the
replica out of the load balancer, a failing /healthz restarts it.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, AsyncIterator

import orjson
from aiohttp import web

from gateway.cache.store import StoreError
from gateway.state import GATEWAY, METRICS, SETTINGS
from gateway.upstream.breaker import State

INTERVAL_S = 5.0


def _upstream(upstream, state: State, passthrough: bool) -> dict[str, Any]:
    why = None
    if state is State.OPEN:
        why = "circuit open after repeated failures"
    elif not passthrough and upstream.key_env is not None and upstream.key(os.environ) is None:
        why = f"no key: ${upstream.key_env} is not set"
    return {"name": upstream.name, "usable": why is None, "circuit": state.value, "why": why}


async def evaluate(app: web.Application) -> dict[str, Any]:
    """The readiness answer, and the gauges set from it."""
    settings, gateway, metrics = app[SETTINGS], app[GATEWAY], app[METRICS]
    store: dict[str, Any] = {"kind": "redis" if settings.redis_url else "in-process", "healthy": True,
                             "error": None, "policy": settings.cache_failure}
    try:
        await gateway.store.ping()
    except StoreError as exc:
        store.update(healthy=False, error=str(exc))
    states = gateway.client.resilience.breakers.states()
    upstreams = [_upstream(u, states.get(u.name, State.CLOSED), settings.passthrough_auth) for u in settings.upstreams]
    store_ok = store["healthy"] or settings.cache_failure == "fail-open"
    ready = store_ok and any(u["usable"] for u in upstreams)
    metrics.ready.set(int(ready))
    metrics.store_up.set(int(store["healthy"]))
    for u in upstreams:
        metrics.upstream_usable.labels(u["name"]).set(int(u["usable"]))
    return {"ready": ready, "degraded": ready and not store["healthy"], "store": store, "upstreams": upstreams}


async def readyz(request: web.Request) -> web.Response:
    body = await evaluate(request.app)
    return web.Response(status=200 if body["ready"] else 503, body=orjson.dumps(body), content_type="application/json")


async def readiness(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: the background check, so the gauges move without probes."""
    async def loop() -> None:
        while True:
            await evaluate(app)
            await asyncio.sleep(INTERVAL_S)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
