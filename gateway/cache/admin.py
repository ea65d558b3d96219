"""The operator's view of the cache: list entries by what filled them, show one, delete one
or all that match. Shared by the HTTP API (gateway/ops/cache_api.py) and `detgate cache
ls|show|rm` (which reach a Redis directly, or a running gateway through that API).

Walks use the store's SCAN (never KEYS), a page at a time. A delete is conditional on the
entry still holding the value it was chosen by (its seal), in one store step, so it never
meets half an entry and never removes an answer that a refresh or a new fill put there since;
a fill racing a delete simply stores its answer afterwards, whole.
"""
from __future__ import annotations

import asyncio
import fnmatch
from dataclasses import dataclass, fields
from typing import Any, Mapping

import orjson

from gateway.apis import SURFACES
from gateway.cache.entry import CorruptEntry, Entry, Sealer, now_in_ms
from gateway.cache.owners import LINK  # ownership records share the store; they are not answers
from gateway.cache.store import Store

MAX_LIMIT = 1000
# Keys a list request walks at most before it answers with a cursor, so that a filter that
# matches little cannot hold one request for the whole store.
SCAN_BUDGET = 20_000


@dataclass(frozen=True)
class Filters:
    tenant: str | None = None
    upstream: str | None = None
    model: str | None = None  # an fnmatch glob over the pinned model (or the answering one, for older entries)
    surface: str | None = None
    finish: str | None = None
    fingerprint: str | None = None  # the answer's system_fingerprint: after a drift, the old build's answers
    older_than_s: float | None = None
    newer_than_s: float | None = None

    @classmethod
    def parse(cls, values: Mapping[str, str]) -> Filters:
        """From query or CLI values; raises ValueError naming the field that is wrong."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown filter {unknown[0]!r}; filters: {', '.join(sorted(known))}")
        out: dict[str, Any] = {}
        for name, value in values.items():
            if name.endswith("_s"):
                try:
                    out[name] = float(value)
                except ValueError:
                    raise ValueError(f"{name} must be a number of seconds, not {value!r}") from None
                if not out[name] >= 0:
                    raise ValueError(f"{name} must be >= 0, not {value!r}")
            elif value:
                out[name] = value
        return cls(**out)

    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def match(self, entry: Entry, now_ms: int) -> bool:
        origin = entry.origin or {}
        for name in ("tenant", "upstream", "surface"):
            wanted = getattr(self, name)
            if wanted is not None and origin.get(name) != wanted:
                return False
        if self.finish is not None and entry.finish != self.finish:
            return False
        if self.model is not None and not fnmatch.fnmatchcase(origin.get("model") or entry.model, self.model):
            return False
        if self.fingerprint is not None and fingerprint(entry) != self.fingerprint:
            return False
        if self.older_than_s is not None or self.newer_than_s is not None:
            filled = origin.get("filled_at_ms")
            if filled is None:
                return False
            age = (now_ms - filled) / 1000
            if self.older_than_s is not None and age < self.older_than_s:
                return False
            if self.newer_than_s is not None and age > self.newer_than_s:
                return False
        return True


def fingerprint(entry: Entry) -> str | None:
    """The build identifier the upstream gave with this answer, by its surface's rule."""
    surface = SURFACES.get((entry.origin or {}).get("surface") or "chat.completions")
    return surface.fingerprint(entry.body) if surface is not None else None


def summary(key: str, entry: Entry, size: int, now_ms: int) -> dict[str, Any]:
    origin = entry.origin or {}
    filled = origin.get("filled_at_ms")
    return {"key": key, "tenant": origin.get("tenant"), "upstream": origin.get("upstream"),
            "surface": origin.get("surface"), "model": origin.get("model") or entry.model,
            "answered_by": entry.model, "finish": entry.finish, "filled_at_ms": filled,
            "age_s": None if filled is None else round((now_ms - filled) / 1000, 3),
            "expires_in_s": None if entry.expires_ms is None else round((entry.expires_ms - now_ms) / 1000, 3),
            "bytes": size}


@dataclass
class Counts:
    scanned: int = 0  # keys the walk visited
    matched: int = 0  # answers the filters matched
    unreadable: int = 0  # values this secret does not vouch for (another secret's, altered, another version)
    deleted: int = 0
    changed: int = 0  # matched, then refilled or deleted by someone else before the delete: left alone


class CacheAdmin:
    def __init__(self, store: Store, sealer: Sealer) -> None:
        self.store = store
        self.sealer = sealer

    async def _read(self, keys: list[str]) -> list[tuple[str, bytes | None]]:
        values = await asyncio.gather(*(self.store.get(key) for key in keys))
        return list(zip(keys, values))

    def _open(self, key: str, raw: bytes) -> Entry | None:
        try:
            return self.sealer.open(key, raw)
        except CorruptEntry:
            return None

    async def _matches(self, filters: Filters, cursor: str, count: int, counts: Counts, now_ms: int):
        """One scan step: [(key, raw, entry)] that match, and the next cursor."""
        keys, cursor = await self.store.scan(cursor, count)
        counts.scanned += len(keys)
        found = []
        for key, raw in await self._read(keys):
            if raw is None:
                continue  # deleted or expired since the scan saw it
            entry = self._open(key, raw)
            if entry is None:
                counts.unreadable += 1
            elif entry.finish != LINK and not entry.expired(now_ms) and filters.match(entry, now_ms):
                counts.matched += 1
                found.append((key, raw, entry))
        return found, cursor

    async def page(self, filters: Filters, cursor: str = "", limit: int = 100) -> dict[str, Any]:
        """A page of matching entries, about `limit` long, and the cursor of the next ("" : done)."""
        counts, rows, now_ms = Counts(), [], now_in_ms()
        while True:
            found, cursor = await self._matches(filters, cursor, max(limit, 100), counts, now_ms)
            rows += [summary(key, entry, len(raw), now_ms) for key, raw, entry in found]
            if not cursor or len(rows) >= limit or counts.scanned >= SCAN_BUDGET:
                break
        return {"entries": rows, "cursor": cursor or None, "scanned": counts.scanned, "matched": counts.matched,
                "unreadable": counts.unreadable}

    async def show(self, key: str) -> dict[str, Any] | None:
        """Everything about one entry; None when there is none. An entry this secret does not
        vouch for is shown as such, without its contents."""
        raw = await self.store.get(key)
        if raw is None:
            return None
        entry = self._open(key, raw)
        if entry is None:
            return {"key": key, "readable": False, "bytes": len(raw),
                    "why": "fails its MAC under this secret, or is of another entry version"}
        now_ms = now_in_ms()
        record = {"model": entry.model, "finish": entry.finish, "meta": entry.meta, "expires_ms": entry.expires_ms,
                  "body": _json_or_text(entry.body),
                  "stream_bytes": None if entry.stream is None else len(entry.stream),
                  "tail": None if entry.tail is None else _json_or_text(entry.tail.removeprefix(b"data: ").strip())}
        return {**summary(key, entry, len(raw), now_ms), "readable": True, "link": entry.finish == LINK,
                "origin": entry.origin, "record": record, "fingerprint": fingerprint(entry),
                "seal": raw[:Sealer.MAC_LEN].decode("ascii", "replace")}

    async def delete(self, key: str) -> bool | None:
        """Delete one entry whatever it holds; None when there was none."""
        raw = await self.store.get(key)
        if raw is None:
            return None
        return await self.store.delete_if(key, raw[:Sealer.MAC_LEN])

    async def delete_matching(self, filters: Filters) -> Counts:
        """Delete every answer `filters` match, walking the whole store a page at a time."""
        counts, cursor, now_ms = Counts(), "", now_in_ms()
        while True:
            found, cursor = await self._matches(filters, cursor, 500, counts, now_ms)
            done = await asyncio.gather(*(self.store.delete_if(key, raw[:Sealer.MAC_LEN]) for key, raw, _ in found))
            counts.deleted += sum(done)
            counts.changed += len(done) - sum(done)
            if not cursor:
                return counts


def _json_or_text(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")
