"""Canary probes: fixed requests whose answers should never change.

A canary goes through the same preparation as a client request (routing, pinning,
de-randomized parameters) but straight to its upstream, never through the cache. The
digest of its first answer becomes its reference (first writer wins across replicas, in
the ledger), unless the config pins one (`expect`); every later answer is compared with
it. A mismatch is a drift event of kind "canary": counted, logged and kept for
/detgate/status, but it never rotates the key namespace, since a black-box provider may
answer differently now and then without any model change.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import asdict, dataclass

import orjson
import xxhash

from gateway.apis import SURFACES
from gateway.apis.surface import Surface
from gateway.cache.feed import Feed
from gateway.cache.store import StoreError
from gateway.config import CanaryConfig, Settings
from gateway.errors import ApiError, UpstreamError
from gateway.ingress.auth import Tenants
from gateway.ops.drift import DriftEvent, DriftMonitor
from gateway.ops.metrics import Metrics
from gateway.policy.prepare import Asked, prepare
from gateway.strategies.single import single
from gateway.upstream.client import UpstreamClient

log = logging.getLogger("detgate.canary")

DIGESTS = "canary-digests"  # canary name -> reference digest
RUNS = "canary-runs"  # canary name -> its last Probe as JSON

_NO_TENANTS = Tenants(())


@dataclass(frozen=True)
class Probe:
    """One canary run."""

    canary: str
    upstream: str
    model: str
    result: str  # "recorded" (first answer, now the reference), "match", "mismatch" or "error"
    digest: str | None
    expected: str | None
    fingerprint: str | None
    at: float
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.result in ("mismatch", "error")


def answer_digest(surface: Surface, body: bytes) -> str:
    """What an answer says (its surface's answer_parts), digested."""
    parsed = orjson.loads(body)
    parts = surface.answer_parts(parsed if isinstance(parsed, dict) else {})
    return xxhash.xxh3_128_hexdigest(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS))


def request_bytes(canary: CanaryConfig) -> bytes:
    model = f"{canary.upstream}/{canary.model}" if canary.upstream else canary.model
    body = {k: v for k, v in canary.body.items() if k not in ("stream", "stream_options")}
    return orjson.dumps({**body, "model": model})


class Canaries:
    def __init__(self, settings: Settings, secret: bytes, client: UpstreamClient, monitor: DriftMonitor,
                 metrics: Metrics) -> None:
        self.canaries = settings.canaries
        # Canaries speak for the gateway itself: its own upstream keys, whoever the clients are.
        self.settings = settings.model_copy(update={"passthrough_auth": False})
        self.secret = secret
        self.client = client
        self.monitor = monitor
        self.metrics = metrics

    async def run_all(self) -> list[Probe]:
        # One after another: canaries are few, and a burst of them is not worth the upstream's load.
        return [await self.run(canary) for canary in self.canaries]

    async def run(self, canary: CanaryConfig) -> Probe:
        upstream, model = canary.upstream or "", canary.model
        try:
            surface = SURFACES[canary.route]
            prepared = prepare(surface, request_bytes(canary), Asked(), self.settings, _NO_TENANTS, self.secret)
            upstream, model = prepared.call.upstream.name, prepared.model
            entry = await single(prepared.call, self.client, Feed())
        except ApiError as exc:
            return await self._finish(Probe(canary.name, upstream, model, "error", None, None, None, time.time(),
                                            f"the canary's request is invalid: {exc.message}"))
        except UpstreamError as exc:
            why = f"upstream answered {exc.status}: {exc.payload()[:300].decode(errors='replace')}"
            return await self._finish(Probe(canary.name, upstream, model, "error", None, None, None, time.time(), why))
        fingerprint = surface.fingerprint(entry.body)
        await self.monitor.observe(upstream, model, fingerprint)
        digest = answer_digest(surface, entry.body)
        try:
            expected, result = await self._compare(canary, digest)
        except StoreError as exc:
            return await self._finish(Probe(canary.name, upstream, model, "error", digest, None, fingerprint,
                                            time.time(), f"ledger unavailable: {exc}"))
        probe = Probe(canary.name, upstream, model, result, digest, expected, fingerprint, time.time())
        if result == "mismatch":
            try:
                await self.monitor.record(DriftEvent("canary", upstream, model, expected, digest, probe.at,
                                                     canary=canary.name))
            except StoreError as exc:
                log.warning("cannot keep the drift event of canary %r: %s", canary.name, exc)
        return await self._finish(probe)

    async def _compare(self, canary: CanaryConfig, digest: str) -> tuple[str, str]:
        if canary.expect:
            return canary.expect, "match" if digest == canary.expect else "mismatch"
        known = (await self.monitor.ledger.read(DIGESTS)).get(canary.name)
        if known is None:
            known = await self.monitor.ledger.claim(DIGESTS, canary.name, digest)
            if known == digest:
                return known, "recorded"
        return known, "match" if digest == known else "mismatch"

    async def _finish(self, probe: Probe) -> Probe:
        self.metrics.canary_runs.labels(probe.canary, probe.result).inc()
        if probe.result != "error":
            self.metrics.canary_status.labels(probe.canary).set(0 if probe.failed else 1)
        else:
            log.warning("canary %r failed: %s", probe.canary, probe.error)
        try:
            await self.monitor.ledger.put(RUNS, probe.canary, orjson.dumps(asdict(probe)).decode())
        except StoreError as exc:
            log.warning("cannot keep canary %r's run: %s", probe.canary, exc)
        return probe

    async def every(self, interval_s: float) -> None:
        """Run all canaries about every `interval_s` across all replicas sharing the ledger:
        each wakes on a jittered timer, and only the first in a turn probes, so N replicas
        do not cost the upstream N canary calls per interval."""
        # Shorter than the shortest sleep, so the replica that ran last can run next time too.
        lease_ms = max(1, int(interval_s * 1000 * 0.8))
        while True:
            await asyncio.sleep(interval_s * random.uniform(0.8, 1.2))
            try:
                if await self._my_turn(lease_ms):
                    await self.run_all()
            except Exception:  # a schedule that dies quietly would leave the status lying
                log.exception("canary run failed")

    async def _my_turn(self, lease_ms: int) -> bool:
        try:
            return await self.monitor.ledger.turn("canaries", lease_ms)
        except StoreError as exc:
            # Probing twice beats not probing: a replica that cannot reach the ledger runs its own.
            log.warning("canary turn unknown, probing anyway: %s", exc)
            return True


def table(probes: list[Probe]) -> str:
    """The probes as an aligned text table, for `detgate probe`."""
    rows = [("canary", "upstream/model", "result", "digest", "expected", "fingerprint")]
    for p in probes:
        rows.append((p.canary, f"{p.upstream}/{p.model}", p.result, (p.digest or "-")[:16], (p.expected or "-")[:16],
                     p.fingerprint or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    errors = [f"{p.canary}: {p.error}" for p in probes if p.error]
    return "\n".join(lines + errors)
