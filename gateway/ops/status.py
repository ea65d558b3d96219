"""GET /detgate/status: what the gateway knows about its upstreams and its store.

Answers even while the store is down (that is when it is most needed): the store is then
reported unhealthy and what only the store knows is left empty.
"""
from __future__ import annotations

from collections import defaultdict

import orjson
from aiohttp import web

from gateway.cache.store import StoreError
from gateway.ingress.auth import Credentials, authenticate, authorize_operator
from gateway.ops.canary import RUNS
from gateway.ops.drift import EPOCHS, EVENTS, FINGERPRINTS, SEEN
from gateway.ops.watch import LEDGER
from gateway.state import SETTINGS, TENANTS

RECENT_EVENTS = 20


def fingerprints(current: dict[str, str], seen: dict[str, str], epochs: dict[str, str]) -> list[dict]:
    first_seen: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for field, mark in seen.items():
        name, _, fingerprint = field.rpartition(" ")
        first_seen[name].append((float(mark.split(" ")[0]), fingerprint))
    rows = []
    for name in sorted(set(current) | set(epochs)):
        upstream, _, model = name.partition("/")
        rows.append({"upstream": upstream, "model": model, "fingerprint": current.get(name),
                     "epoch": int(epochs.get(name, 0)),
                     "seen": [{"fingerprint": fp, "first_seen": at} for at, fp in sorted(first_seen[name])]})
    return rows


def canaries(configured: tuple, runs: dict[str, str]) -> list[dict]:
    rows = []
    for canary in configured:
        run = runs.get(canary.name)
        rows.append(orjson.loads(run) if run else {"canary": canary.name, "result": "not run yet"})
    return rows


async def status(request: web.Request) -> web.Response:
    app = request.app
    settings = app[SETTINGS]
    if not authorize_operator(request.headers.get("Authorization"), app[TENANTS]):
        authenticate(Credentials.of(request.headers), app[TENANTS], settings.passthrough_auth)
    ledger = app[LEDGER]
    body = {"mode": settings.mode, "drift_policy": settings.drift_policy,
            "store": {"kind": ledger.kind, "healthy": True, "error": None},
            "fingerprints": [], "canaries": canaries(settings.canaries, {}), "drift_events": []}
    try:
        await ledger.ping()
        body["fingerprints"] = fingerprints(await ledger.read(FINGERPRINTS), await ledger.read(SEEN),
                                            await ledger.read(EPOCHS))
        body["canaries"] = canaries(settings.canaries, await ledger.read(RUNS))
        body["drift_events"] = [orjson.loads(e) for e in await ledger.recent(EVENTS, RECENT_EVENTS)]
    except StoreError as exc:
        body["store"].update(healthy=False, error=str(exc))
    return web.Response(body=orjson.dumps(body), content_type="application/json")
