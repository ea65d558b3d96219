"""The stored cache entry: a versioned record of one answer in both wire forms.

Both forms are fixed when the entry is written, by the answer's API surface
(gateway/apis): the non-stream body and the stream as its frames. Every reader then
gets bytes rendered from those by a pure function of its request, so a stream recorded
on a miss serves later non-stream requests and a non-stream answer serves later
streams, identically for everyone.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.policy.keys import entry_mac, verify_entry

ENTRY_VERSION = 2


@dataclass(frozen=True)
class Entry:
    body: bytes  # the non-stream JSON response
    stream: bytes | None  # the stream's frames as sent live, without its end; None where a surface has none
    model: str  # the model version the upstream said answered
    # Why the answer ended, as its surface classes it ("stop", "length", "content_filter"):
    # what decides whether it is stored.
    finish: str = "stop"
    tail: bytes | None = None  # a last frame only readers that ask for it get (OpenAI's usage chunk)
    # How the answer was chosen ({"vote": record, "attempts": n}), kept with it so that hits
    # report it as the miss did; None for a plain call.
    meta: dict[str, Any] | None = None
    # When it ages out (Unix time, ms), sealed with it so that every copy (a near cache, an
    # export) ages out with it; None: never.
    expires_ms: int | None = None
    # Who filled it, when, and for what request (gateway/cache/origin.py), for the operator's
    # cache API; not rendered to clients. None in entries written before it was kept.
    origin: dict[str, Any] | None = None

    def expired(self, now_ms: int | None = None) -> bool:
        return self.expires_ms is not None and self.expires_ms <= (now_ms if now_ms is not None else now_in_ms())


def now_in_ms() -> int:
    return time.time_ns() // 1_000_000


class CorruptEntry(ValueError):
    pass


class OtherVersion(CorruptEntry):
    """An entry written by a gateway of another ENTRY_VERSION: sound, but not readable here."""


class TamperedEntry(CorruptEntry):
    """The stored bytes are not what this gateway sealed under this key: altered in the
    store, copied from another key, or sealed with another secret."""


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise CorruptEntry("an entry field that should be text is not")
    return value.encode()


def encode(entry: Entry) -> bytes:
    record = {"v": ENTRY_VERSION, "model": entry.model, "finish": entry.finish, "body": entry.body.decode(),
              "stream": _text(entry.stream), "tail": _text(entry.tail)}
    if entry.meta:
        record["meta"] = entry.meta
    if entry.expires_ms is not None:
        record["expires_ms"] = entry.expires_ms
    if entry.origin:
        record["origin"] = entry.origin
    return orjson.dumps(record)


def decode(raw: bytes) -> Entry:
    try:
        record = orjson.loads(raw)
        if record["v"] != ENTRY_VERSION:
            raise OtherVersion(f"entry version {record['v']!r}, this gateway reads {ENTRY_VERSION}")
        meta = record.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise CorruptEntry("entry meta is not an object")
        expires = record.get("expires_ms")
        if expires is not None and type(expires) is not int:
            raise CorruptEntry("entry expires_ms is not an integer")
        origin = record.get("origin")
        if origin is not None and not isinstance(origin, dict):
            raise CorruptEntry("entry origin is not an object")
        return Entry(_bytes(record["body"]), _bytes(record["stream"]), str(record["model"]), str(record["finish"]),
                     _bytes(record["tail"]), meta, expires, origin)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptEntry(f"unreadable cache entry: {exc}") from exc


class Sealer:
    """Binds each stored value to its key with a MAC, so an entry edited in the store, or
    copied under another key, reads as corrupt instead of being served."""

    MAC_LEN = 64  # hex digits of keys.entry_mac
    MEMO = 4096  # entries whose checked bytes are remembered

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        # key -> (value, entry) already checked: a hot key's bytes are compared, not re-MACed
        # and re-parsed, on every hit. A changed value (a refresh) simply misses the memo.
        self._memo: dict[str, tuple[bytes, Entry]] = {}

    def seal(self, key: str, entry: Entry) -> bytes:
        raw = encode(entry)
        return entry_mac(self.secret, key, raw).encode() + raw

    def open(self, key: str, value: bytes) -> Entry:
        seen = self._memo.get(key)
        if seen is not None and seen[0] == value:
            return seen[1]
        mac, raw = value[: self.MAC_LEN], value[self.MAC_LEN:]
        if not verify_entry(self.secret, key, raw, mac.decode("ascii", "replace")):
            raise TamperedEntry("cache entry fails its MAC check")
        entry = decode(raw)
        if len(self._memo) >= self.MEMO:
            del self._memo[next(iter(self._memo))]
        self._memo[key] = (value, entry)
        return entry
