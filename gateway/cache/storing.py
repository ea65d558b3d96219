"""Which complete answers the cache keeps, and for how long: the store rules from config.

Only complete answers ever reach these rules: errors, 200s without an answer and streams
cut short are refused by their surface before (gateway/apis). What is left is judged by
its finish class, as the surface classes the upstream's finish reason (Entry.finish):
"stop" (a natural end, tool calls included), "length" (cut by the token limit the request
set: the same request is cut the same way, so it is kept by default) and "content_filter"
(cut or emptied by the provider's filter, which changes independently of the model: not
kept by default, so a later request asks again). An answer the rules decline is still
served to everyone waiting for it, with a warning; it is simply not there for the next.

A TTL makes entries age out: `ttl_s` for every model, or the seconds of the first glob in
`model_ttl_s` that matches the pinned model; 0 keeps entries until evicted or refreshed.
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from gateway.cache.entry import Entry

if TYPE_CHECKING:
    from gateway.config import Settings

FINISHES = frozenset({"stop", "length", "content_filter"})  # the classes surfaces sort finish reasons into
# The entry meta of an answer its strategy passed on but found invalid (a stream checked at
# its end, gateway/strategies/checked_stream.py): never stored, whatever the rules say.
REJECTED = "rejected"


def rejection(entry: Entry) -> str | None:
    """Why the strategy that produced `entry` will not have it stored; None when it may be."""
    return (entry.meta or {}).get(REJECTED) or None


@dataclass(frozen=True)
class StoreRules:
    finishes: frozenset[str]  # the finish classes stored
    ttl_s: float  # 0: no limit
    model_ttl_s: tuple[tuple[str, float], ...]  # (glob, seconds), first match wins

    @classmethod
    def from_settings(cls, settings: Settings) -> StoreRules:
        return cls(frozenset(settings.store_finish), settings.ttl_s, tuple(settings.model_ttl_s.items()))

    def declines(self, entry: Entry) -> str | None:
        """Why `entry` is not stored; None when it is."""
        if entry.finish in self.finishes:
            return None
        return f"finish_reason class {entry.finish} (store_finish: {', '.join(sorted(self.finishes))})"

    def ttl_ms(self, model: str) -> int:
        """How long an answer of `model` (the pinned version) is kept; 0: no limit."""
        seconds = next((s for glob, s in self.model_ttl_s if fnmatchcase(model, glob)), self.ttl_s)
        return round(seconds * 1000)
