"""Drift: noticing that an upstream's model changed under the cache, and what to do about it.

Every upstream answer carries a `system_fingerprint`; a fingerprint never seen before for
an (upstream, model) that already had one is a drift event. Providers are known to
answer from several backends at once, so a fingerprint seen earlier coming back is not
counted again: only new ones are.

Policy `keep` goes on serving what is cached (stable answers, now from an older model
than fresh misses get). Policy `rotate` bumps that pair's namespace epoch in the ledger;
the epoch is folded into every cache key of the pair, so all replicas start answering
afresh from the new model as soon as they read the epoch (at once on the replica that saw
the drift, within `drift_sync_s` elsewhere). Keys are namespaced after the request memo,
so a memoized key can never outlive a rotation.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import asdict, dataclass, replace

import orjson

from gateway.cache.store import StoreError
from gateway.ops.ledger import Ledger
from gateway.ops.metrics import Metrics
from gateway.policy.keys import KEY_PREFIX

log = logging.getLogger("detgate.drift")

FINGERPRINTS = "fingerprints"  # "upstream/model" -> the fingerprint last filed as new by a replica
SEEN = "fingerprints-seen"  # "upstream/model fingerprint" -> unix time first seen
EPOCHS = "epochs"  # "upstream/model" -> namespace epoch, bumped by `rotate`
EVENTS = "drift-events"  # JSON events, newest first
KEEP_EVENTS = 100

_NAMESPACE_DOMAIN = b"detgate/namespace\x00"


def pair(upstream: str, model: str) -> str:
    # Upstream names cannot contain "/", so this splits back unambiguously.
    return f"{upstream}/{model}"


def namespaced(secret: bytes, key: str, epoch: int) -> str:
    """The key `key` has in namespace `epoch`: a keyed hash, so it stays unguessable and
    cannot collide with a key of another epoch."""
    message = _NAMESPACE_DOMAIN + key.encode() + b"\x00" + str(epoch).encode()
    return KEY_PREFIX + hmac.new(secret, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class DriftEvent:
    kind: str  # "fingerprint" or "canary"
    upstream: str
    model: str
    old: str
    new: str
    at: float
    epoch: int | None = None  # the new namespace epoch when the policy rotated
    canary: str | None = None

    def warning(self) -> str:
        what = f"canary {self.canary!r} answer" if self.canary else "system_fingerprint"
        then = (f"new key namespace {self.epoch}: answers are fetched afresh" if self.epoch is not None
                else "cached answers are kept")
        return f"drift: {pair(self.upstream, self.model)} {what} changed from {self.old} to {self.new}; {then}"


class DriftMonitor:
    def __init__(self, ledger: Ledger, policy: str, secret: bytes, metrics: Metrics) -> None:
        self.ledger = ledger
        self.policy = policy
        self.secret = secret
        self.metrics = metrics
        self.epochs: dict[str, int] = {}  # this replica's copy of the ledger's EPOCHS
        # Fingerprints this replica has filed: the ledger is asked only about new ones, so a
        # miss pays for drift detection only when the fingerprint changes.
        self._filed: set[tuple[str, str]] = set()
        self._latest: dict[str, str] = {}  # "upstream/model" -> the fingerprint this replica filed last

    def key(self, key: str, upstream: str, model: str) -> str:
        """The key a request signed as `key` is cached under now. On the hit path: without any
        rotation it is one truth test."""
        if not self.epochs:
            return key
        epoch = self.epochs.get(pair(upstream, model))
        return namespaced(self.secret, key, epoch) if epoch else key

    def peek(self, upstream: str, model: str, fingerprint: str | None) -> str | None:
        """A warning when this replica knows another fingerprint for the pair and not this one,
        decided without the ledger: for live streams, whose headers leave with the first
        event, before observe() has asked the ledger (that happens as the stream completes)."""
        name = pair(upstream, model)
        known = self._latest.get(name)
        if not fingerprint or not known or (name, fingerprint) in self._filed:
            return None
        return f"drift: {name} system_fingerprint changed from {known} to {fingerprint}"

    async def observe(self, upstream: str, model: str, fingerprint: str | None) -> DriftEvent | None:
        """Record an upstream answer's fingerprint; the drift event when it is a new one.
        A ledger outage is counted and skipped: it must not fail the request."""
        name = pair(upstream, model)
        if not fingerprint or (name, fingerprint) in self._filed:
            return None
        now = time.time()
        mark = f"{now!r} {secrets.token_hex(4)}"  # unique, so only one racing replica finds it its own
        try:
            first_seen = await self.ledger.claim(SEEN, f"{name} {fingerprint}", mark)
            previous = await self.ledger.swap(FINGERPRINTS, name, fingerprint)
            self._filed.add((name, fingerprint))
            self._latest[name] = fingerprint
            if first_seen != mark or previous is None or previous == fingerprint:
                return None
            event = DriftEvent("fingerprint", upstream, model, previous, fingerprint, now)
            return await self.record(event)
        except StoreError as exc:
            self.metrics.cache_errors.labels("ledger").inc()
            log.warning("drift ledger unavailable: %s", exc)
            return None

    async def record(self, event: DriftEvent) -> DriftEvent:
        """Count, log and keep a drift event; under `rotate`, a new fingerprint opens the pair's
        next namespace (a canary mismatch does not: it may be the provider's own noise)."""
        name = pair(event.upstream, event.model)
        if self.policy == "rotate" and event.kind == "fingerprint":
            epoch = await self.ledger.incr(EPOCHS, name)
            self.epochs = {**self.epochs, name: epoch}
            event = replace(event, epoch=epoch)
        self.metrics.drift_events.labels(event.upstream, event.model, event.kind).inc()
        log.warning(event.warning())
        await self.ledger.push(EVENTS, orjson.dumps(asdict(event)).decode(), KEEP_EVENTS)
        return event

    async def sync(self) -> None:
        """Read the namespace epochs other replicas may have bumped. Epochs only grow, so the
        larger one wins: a read that raced this replica's own bump cannot undo it."""
        stored = {name: int(value) for name, value in (await self.ledger.read(EPOCHS)).items()}
        mine = self.epochs
        self.epochs = {name: max(stored.get(name, 0), mine.get(name, 0)) for name in stored.keys() | mine.keys()}

    async def follow(self, interval_s: float) -> None:
        """Keep `epochs` current, for as long as the app runs. An outage is logged when it
        starts and when it ends, not on every try."""
        down = False
        while True:
            try:
                await self.sync()
                if down:
                    log.warning("namespace epochs readable again")
                down = False
            except StoreError as exc:
                self.metrics.cache_errors.labels("ledger").inc()
                if not down:
                    log.warning("cannot read namespace epochs (retrying every %ss): %s", interval_s, exc)
                down = True
            await asyncio.sleep(interval_s)
