"""n > 1 under a splitting profile: n one-answer requests (seeds seed..seed+n-1), each
cached on its own key, merged in order into the one response the client asked for.

The merged entry is never stored: it is a pure function of its parts' stored entries, so
every request for the same n gets the same bytes, and a later n=1 request with one of
those seeds is a hit on its part.
"""
from __future__ import annotations

import orjson

from gateway.cache.entry import Entry, from_body
from gateway.policy.profiles import merge_n


def merged(route: str, parts: list[Entry]) -> Entry:
    entry = from_body(route, orjson.dumps(merge_n([orjson.loads(p.body) for p in parts])))
    metas = [p.meta or {} for p in parts]
    meta: dict = {}
    if any("vote" in m for m in metas):
        meta["vote"] = {"votes": ",".join(str((m.get("vote") or {}).get("votes", "-")) for m in metas)}
    if any("attempts" in m for m in metas):
        meta["attempts"] = sum(int(m.get("attempts", 1)) for m in metas)
    return Entry(entry.body, entry.sse, entry.model, meta or None)
