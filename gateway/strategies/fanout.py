"""n > 1 under a splitting profile: n one-answer requests (seeds seed..seed+n-1), each
cached on its own key, merged in order into the one response the client asked for.

The merged entry is never stored: it is a pure function of its parts' stored entries, so
every request for the same n gets the same bytes, and a later n=1 request with one of
those seeds is a hit on its part.
"""
from __future__ import annotations

import dataclasses

import orjson

from gateway.apis.surface import Surface
from gateway.cache.entry import Entry


def merged(surface: Surface, upstream: str, parts: list[Entry]) -> Entry:
    entry = surface.from_body(upstream, orjson.dumps(surface.merge_n([orjson.loads(p.body) for p in parts])))
    metas = [p.meta or {} for p in parts]
    meta: dict = {}
    if any("vote" in m for m in metas):
        meta["vote"] = {"votes": ",".join(str((m.get("vote") or {}).get("votes", "-")) for m in metas)}
    if any("attempts" in m for m in metas):
        meta["attempts"] = sum(int(m.get("attempts", 1)) for m in metas)
    return dataclasses.replace(entry, meta=meta or None)
