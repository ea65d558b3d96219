"""The app's watch over its upstreams: the drift monitor and the canary schedule.

A cleanup context, started after the core resources (canaries need the upstream client),
so that `detgate serve` and `detgate probe` build it the same way.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

from aiohttp import web

from gateway.cache.store import StoreError
from gateway.ops.canary import Canaries
from gateway.ops.drift import DriftMonitor
from gateway.ops.ledger import Ledger, open_ledger
from gateway.state import GATEWAY, METRICS, SECRET, SETTINGS

log = logging.getLogger("detgate.drift")

DRIFT = web.AppKey("drift", DriftMonitor)
CANARIES = web.AppKey("canaries", Canaries)
LEDGER = web.AppKey("ledger", Ledger)
UPSTREAM = web.RequestKey("upstream", str)  # the upstream's name, for the drift check of a live stream


async def watch(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    ledger = open_ledger(settings.redis_url, settings.store_timeout_s)
    monitor = DriftMonitor(ledger, settings.drift_policy, app[SECRET], app[METRICS])
    try:
        await monitor.sync()
    except StoreError as exc:  # started without its Redis: the follower below catches up later
        log.warning("cannot read namespace epochs at start: %s", exc)
    app[LEDGER] = ledger
    app[DRIFT] = monitor
    app[CANARIES] = canaries = Canaries(settings, app[SECRET], app[GATEWAY].client, monitor, app[METRICS])
    tasks = []
    if settings.redis_url:  # an in-process ledger is only ever changed by this process
        tasks.append(asyncio.create_task(monitor.follow(settings.drift_sync_s)))
    if settings.canaries and settings.canary_interval_s > 0:
        tasks.append(asyncio.create_task(canaries.every(settings.canary_interval_s)))
    try:
        yield
    finally:
        # Asked again until each ends: before Python 3.12 a timeout wrapper inside a Redis or
        # HTTP call can swallow a cancel that lands as it completes, and the loop would run on
        # (seen once in CI: a canary loop outlived its gateway and probed 328 times).
        while pending := [task for task in tasks if not task.done()]:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=0.1)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await ledger.close()
