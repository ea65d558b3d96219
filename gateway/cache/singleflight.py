"""One fill per key: in this process by sharing a task, across replicas by a leased lock.

A flight runs as its own task, apart from the requests that wait on it, so a client
that disconnects never cancels a call that others share, and an answer that completes
is stored even when nobody is left to read it.

Across replicas the lock is `SET NX PX` with a lease that the holder renews while it
works. The others poll for the entry; when the lock disappears without an entry (the
holder failed, or died and its lease ran out) one of them takes over.

The flight decides what is stored, by the store rules (gateway/cache/storing.py): an
answer they decline, or its strategy rejected, is handed to its waiters all the same and
the lock is released without an entry, so the next request asks again.
"""
from __future__ import annotations

import asyncio
import dataclasses
import secrets
from dataclasses import dataclass
from typing import Awaitable, Callable

from gateway.cache.entry import CorruptEntry, Entry, Sealer, TamperedEntry, now_in_ms
from gateway.cache.feed import Feed
from gateway.cache.store import Store, StoreError
from gateway.cache.storing import StoreRules, rejection
from gateway.ops import tracing

Produce = Callable[[Feed], Awaitable[Entry]]

POLL_FIRST_S = 0.005
POLL_MAX_S = 0.05


@dataclass(frozen=True)
class Outcome:
    entry: Entry
    filled: bool  # False when another replica's entry arrived while we waited for its lock
    stored: bool = True  # False when this answer went out uncached
    # Why the store rules kept it out of the store; None when it is stored, or the store failed.
    declined: str | None = None
    # This flight's own answer where `entry` is another call's, stored first while this flight
    # flew without the cross-replica lock: what its live readers were sent, which the store lacks.
    overtaken: Entry | None = None


@dataclass(frozen=True)
class Flight:
    feed: Feed
    task: asyncio.Task[Outcome]


class SingleFlight:
    def __init__(self, store: Store, sealer: Sealer, lease_ms: int, on_store_error: Callable[[str], None],
                 rules: StoreRules, on_declined: Callable[[Entry], None]) -> None:
        self.store = store
        self.sealer = sealer
        self.lease_ms = lease_ms
        self.rules = rules
        self.owner = secrets.token_hex(8)  # this process, in lock values
        self._on_store_error = on_store_error
        self._on_declined = on_declined
        self._flights: dict[str, Flight] = {}

    def join(self, key: str, produce: Produce, model: str, *, refresh: bool = False,
             replace: bool = False) -> tuple[Flight, bool]:
        """The flight for `key`, started by this call when none is in the air; True for the
        starter. `model` (the pinned version) picks the entry's TTL. `refresh` fills anew
        whatever is stored; `replace` overwrites a stored value found stale (expired) unless
        another replica fills the key first."""
        flight = self._flights.get(key)
        if flight is not None:
            tracing.waiting(flight.task, key)
            return flight, False
        feed = Feed()
        fill = self._fill(key, produce, feed, refresh, refresh or replace, self.rules.ttl_ms(model))
        flight = Flight(feed, asyncio.create_task(fill))
        self._flights[key] = flight
        flight.task.add_done_callback(lambda task: self._landed(key, task))
        return flight, True

    def _landed(self, key: str, task: asyncio.Task) -> None:
        self._flights.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here: a failure nobody waited for is not worth a warning

    async def _fill(self, key: str, produce: Produce, feed: Feed, refresh: bool, overwrite: bool,
                    ttl_ms: int) -> Outcome:
        try:
            lock = tracing.start("detgate.singleflight.lock", {"detgate.key_prefix": key[:tracing.KEY_PREFIX_CHARS]})
            waited = await self._acquire(key, refresh)
            tracing.end(lock, {"detgate.filled_elsewhere": isinstance(waited, Entry)})
            if isinstance(waited, Entry):
                return Outcome(waited, filled=False)
            heartbeat = asyncio.create_task(self._heartbeat(key))
            try:
                entry = await produce(feed)
            except BaseException:
                await self._safely("unlock", self.store.unlock(key, self.owner))
                raise
            finally:
                heartbeat.cancel()
            rejected = rejection(entry)
            declined = rejected or self.rules.declines(entry)
            if declined is not None:
                if rejected is None:  # counted by finish class; a rejection, by its strategy
                    self._on_declined(entry)
                await self._safely("unlock", self.store.unlock(key, self.owner))
                return Outcome(entry, filled=True, stored=False, declined=declined)
            stored, kept, overtaken = await self._commit(key, entry, overwrite, ttl_ms)
            return Outcome(kept, filled=True, stored=stored, overtaken=entry if overtaken else None)
        finally:
            feed.close()

    async def _acquire(self, key: str, refresh: bool) -> Entry | None:
        """Take the fill lock, or return the entry another replica wrote while we waited."""
        delay = POLL_FIRST_S
        first = True
        while True:
            locked = await self._safely("lock", self.store.try_lock(key, self.owner, self.lease_ms), default=True)
            if locked:
                # After a wait the holder we waited for may have written just before leaving.
                if not first and not refresh:
                    return await self._read(key)
                return None
            first = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
            if not refresh:
                entry = await self._read(key)
                if entry is not None:
                    return entry

    async def _read(self, key: str) -> Entry | None:
        raw = await self._safely("get", self.store.get(key))
        entry = None if raw is None else self.unseal(key, raw)
        return None if entry is None or entry.expired() else entry

    def unseal(self, key: str, raw: bytes) -> Entry | None:
        """The entry in a value stored under `key`; None, counted, when the value fails its
        checks (a fill then overwrites it)."""
        try:
            return self.sealer.open(key, raw)
        except CorruptEntry as exc:
            self._on_store_error("tamper" if isinstance(exc, TamperedEntry) else "decode")
            return None

    async def _commit(self, key: str, entry: Entry, overwrite: bool, ttl_ms: int) -> tuple[bool, Entry, bool]:
        """Store first-writer-wins, release the lock, and return (whether the store holds an
        answer, what it holds, which every reader then gets, whether that is another call's)."""
        if ttl_ms:
            entry = dataclasses.replace(entry, expires_ms=now_in_ms() + ttl_ms)
        raw = self.sealer.seal(key, entry)
        stored = await self._safely("put", self.store.commit(key, raw, self.owner, overwrite=overwrite, ttl_ms=ttl_ms))
        if stored is None:  # the store failed: this answer goes out unstored; the lock lapses by lease
            return False, entry, False
        if stored:
            return True, entry, False
        winner = await self._read(key)
        return winner is not None, winner or entry, winner is not None

    async def _heartbeat(self, key: str) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            await self._safely("renew", self.store.renew(key, self.owner, self.lease_ms))

    async def _safely(self, op: str, call: Awaitable, default=None):
        # A store outage degrades to uncached service, counted, rather than failing requests.
        try:
            return await call
        except StoreError:
            self._on_store_error(op)
            return default

    async def close(self) -> None:
        """At shutdown: stop the fills still running (their locks lapse by lease)."""
        tasks = [f.task for f in self._flights.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
