"""Cache entries in and out of a store as JSONL: golden answers a team commits and replays.

One line per entry, sorted by key, so that two exports of the same cache are the same file
and a diff shows only real changes. A line holds the entry's sealed bytes exactly: its
record, embedded as the JSON it is stored as, and the MAC the gateway sealed it with:

    {"entry": {"v": 2, "model": ..., "finish": ..., "body": ..., ...}, "key": "dg3:...", "mac": "..."}

so import stores byte for byte what export read, whatever the record holds.

When a drift policy `rotate` has moved some model's keys to a newer namespace, the file
starts with the namespace epochs the keys were made in, and import raises the ledger's
epochs to them; without that line a fresh Redis would look for the entries under their
first namespace and replay would miss every one:

    {"epochs": {"openai/gpt-4o-2024-08-06": 2}}

Recorded agent sessions (gateway/cache/sessions.py) follow the entries, one line per turn,
sorted by tenant, session and turn, each turn's sealed bytes exactly as stored:

    {"mac": "...", "session": "<session tag>", "tenant": "<tenant tag>", "turn": {"canonical": ..., "key": ..., ...}}

Import stores each session whole, replacing the one stored (a session is never left half
imported), and rebuilds the index that finds a turn by its masked key.

Keys are signed with the gateway's secret, so entries are only ever found by a gateway
that has the secret they were exported under: CI that replays golden answers runs with
the same secret as the gateway that recorded them. Export vouches for every line: it
writes only entries that verify under the exporting secret and that this gateway can
read and still serve, and counts the others by why (sealed under another secret, as an
earlier secret leaves them on a shared Redis; of an older key schema or entry version;
unreadable; expired), so a file it writes always imports. Import verifies each entry's
MAC with the importing secret and refuses the ones that fail (edited by hand, or exported
under another secret: their keys could never match a request anyway). `--reseal` trusts
the file instead and seals every entry anew, for a golden file edited on purpose. An
entry keeps its TTL: import stores it for the time it has left, and skips one already past it.
"""
from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import IO

import orjson
from tqdm import tqdm

from gateway.cache.entry import (
    CorruptEntry,
    Entry,
    OtherVersion,
    Sealer,
    decode,
    now_in_ms,
)
from gateway.cache.session_store import SessionStore
from gateway.cache.sessions import MAC_LEN as TURN_MAC_LEN
from gateway.cache.sessions import Turn, turn_mac, verify_turn
from gateway.cache.store import Store
from gateway.policy.keys import KEY_PREFIX, entry_mac, verify_entry

BATCH = 64  # concurrent reads while exporting
MAC_LEN = Sealer.MAC_LEN
_KEY = re.compile(re.escape(KEY_PREFIX) + "[0-9a-f]{64}")
_TAG = re.compile("[0-9a-f]{32}")

# Why an entry is left out, as export and import say it.
FOREIGN = "sealed under another secret (or altered in the store)"
OLD_KEY = "of an older key schema"
OLD_ENTRY = "of another entry version"
UNREADABLE = "unreadable"
EXPIRED = "past their TTL"
GONE = "gone before they were read"


@dataclass
class Counts:
    written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # why -> entries left out, not a fault of the file
    rejected: int = 0
    problems: list[str] = field(default_factory=list)  # the first few, for the message
    epochs: dict[str, int] = field(default_factory=dict)  # namespace epochs an imported file names
    sessions: int = 0
    turns: int = 0

    def reject(self, problem: str) -> None:
        self.rejected += 1
        if len(self.problems) < 5:
            self.problems.append(problem)

    def recorded(self) -> str:
        """" and 2 sessions (9 turns)", or "" for none."""
        if not self.sessions:
            return ""
        return f" and {self.sessions} session{'s' if self.sessions > 1 else ''} ({self.turns} turns)"

    def skips(self) -> str:
        """"; skipped 3: 2 sealed under another secret, 1 past their TTL", or "" for none."""
        if not self.skipped:
            return ""
        return f"; skipped {sum(self.skipped.values())}: " + ", ".join(
            f"{n} {why}" for why, n in sorted(self.skipped.items(), key=lambda item: -item[1]))


def _readable(raw: bytes) -> Entry | str:
    """The entry in a record, or why it is left out."""
    try:
        entry = decode(raw)
    except OtherVersion:
        return OLD_ENTRY
    except CorruptEntry:
        return UNREADABLE
    return EXPIRED if entry.expired() else entry


def export_line(key: str, value: bytes, secret: bytes) -> bytes | str:
    """The JSONL line for a stored value, or why it is not exported."""
    if not _KEY.fullmatch(key):
        return OLD_KEY
    mac, raw = value[:MAC_LEN].decode("ascii", "replace"), value[MAC_LEN:]
    if not verify_entry(secret, key, raw, mac):
        return FOREIGN
    found = _readable(raw)
    if isinstance(found, str):
        return found
    # The record as stored, byte for byte (orjson wrote it: JSON that needs no re-encoding).
    return b'{"entry":' + raw + b',"key":"' + key.encode() + b'","mac":"' + mac.encode() + b'"}\n'


def epochs_line(epochs: dict[str, int]) -> bytes:
    return orjson.dumps({"epochs": epochs}, option=orjson.OPT_SORT_KEYS) + b"\n"


def read_epochs(record: dict) -> dict[str, int]:
    epochs = record["epochs"]
    if (len(record) != 1 or not isinstance(epochs, dict)
            or not all(type(v) is int and v > 0 for v in epochs.values())):
        raise ValueError('an "epochs" line holds one object of model -> positive integer')
    return epochs


def import_value(record: dict, secret: bytes, reseal: bool) -> tuple[str, bytes, Entry]:
    """(key, value to store, its entry) for an entry line; ValueError saying what is wrong with it."""
    if not {"key", "mac", "entry"} <= record.keys():
        raise ValueError("not an object with key, mac and entry")
    key, mac = record["key"], record["mac"]
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"key {str(key)[:80]!r} is not a {KEY_PREFIX} cache key")
    if not isinstance(record["entry"], dict):
        raise ValueError("its entry is not an object")
    raw = orjson.dumps(record["entry"])  # the exported bytes again: orjson reads and writes them unchanged
    try:
        entry = decode(raw)
    except CorruptEntry as exc:
        raise ValueError(str(exc)) from None
    if reseal:
        mac = entry_mac(secret, key, raw)
    elif not verify_entry(secret, key, raw, mac):
        raise ValueError(f"entry {key} fails its MAC check under this secret (exported under another secret, "
                         f"or edited; --reseal trusts the file)")
    return key, mac.encode() + raw, entry


def turn_line(tenant: str, session: str, value: bytes, secret: bytes) -> tuple[tuple, bytes] | str:
    """(its sort key, the JSONL line) for a stored turn, or why it is not exported."""
    mac, raw = value[:TURN_MAC_LEN], value[TURN_MAC_LEN:]
    if not verify_turn(secret, tenant, session, raw, mac):
        return FOREIGN
    try:
        turn = Turn.decode(raw)
    except ValueError:
        return UNREADABLE
    line = (b'{"mac":"' + mac + b'","session":"' + session.encode() + b'","tenant":"' + tenant.encode()
            + b'","turn":' + raw + b"}\n")
    return (tenant, session, turn.n, turn.at_ms, turn.key), line


def import_turn(record: dict, secret: bytes, reseal: bool) -> tuple[str, str, Turn, bytes]:
    """(tenant tag, session tag, the turn, the value to store) for a turn line; ValueError
    saying what is wrong with it."""
    if set(record) != {"mac", "session", "tenant", "turn"}:
        raise ValueError("a turn line is an object of mac, session, tenant and turn")
    tenant, session, mac = record["tenant"], record["session"], record["mac"]
    if not all(isinstance(t, str) and _TAG.fullmatch(t) for t in (tenant, session)):
        raise ValueError("its tenant and session are not session-store tags")
    raw = orjson.dumps(record["turn"])
    turn = Turn.decode(raw)
    if reseal:
        mac = turn_mac(secret, tenant, session, raw)
    elif not verify_turn(secret, tenant, session, raw, mac):
        raise ValueError(f"turn {turn.n} of session {session} fails its MAC check under this secret (exported "
                         f"under another secret, or edited; --reseal trusts the file)")
    return tenant, session, turn, mac.encode() + raw


async def export_entries(store: Store, out: IO[bytes], secret: bytes, epochs: dict[str, int],
                         progress: bool = True, sessions: SessionStore | None = None) -> Counts:
    counts = Counts()
    if epochs:
        out.write(epochs_line(epochs))
    keys = sorted([key async for key in store.keys()])
    with tqdm(total=len(keys), unit="entry", desc="export", disable=not progress) as bar:
        for at in range(0, len(keys), BATCH):
            batch = keys[at:at + BATCH]
            for key, value in zip(batch, await asyncio.gather(*(store.get(key) for key in batch))):
                line = GONE if value is None else export_line(key, value, secret)
                if isinstance(line, str):
                    counts.skipped[line] += 1
                else:
                    out.write(line)
                    counts.written += 1
            bar.update(len(batch))
    if sessions is not None:
        await _export_sessions(sessions, out, secret, counts)
    return counts


async def _export_sessions(sessions: SessionStore, out: IO[bytes], secret: bytes, counts: Counts) -> None:
    lines = []
    for tenant in sorted({tenant async for tenant in sessions.tenants()}):
        for session in sorted(await sessions.sessions(tenant)):
            found = [turn_line(tenant, session, value, secret) for value in (await sessions.turns(tenant, session)).values()]
            kept = [line for line in found if not isinstance(line, str)]
            for why in (line for line in found if isinstance(line, str)):
                counts.skipped[f"turns {why}"] += 1
            counts.sessions += bool(kept)
            lines += kept
    for _, line in sorted(lines):
        out.write(line)
    counts.turns = len(lines)


async def import_entries(store: Store, source: IO[bytes], secret: bytes, *, reseal: bool = False,
                         progress: bool = True, sessions: SessionStore | None = None) -> Counts:
    """Every valid entry line is stored, replacing what is there: the file is the truth. The
    epochs it names come back in the counts, for the caller to raise the ledger's to. The
    turns of a session are stored once the file is read, each session whole; a session with
    a rejected turn is not stored."""
    counts = Counts()
    turns: dict[tuple[str, str], list[tuple[Turn, bytes]]] = {}
    broken: set[tuple[str, str]] = set()
    owner = secrets.token_hex(8)  # a fill-lock owner no one holds: commit then only writes
    size = os.fstat(source.fileno()).st_size
    with tqdm(total=size, unit="B", unit_scale=True, desc="import", disable=not progress) as bar:
        for number, line in enumerate(source, 1):
            bar.update(len(line))
            if not line.strip():
                continue
            record = None
            try:
                record = orjson.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
                if "epochs" in record:
                    counts.epochs.update(read_epochs(record))
                    continue
                if "turn" in record:
                    if sessions is None:
                        raise ValueError("a session turn, but sessions are not imported here")
                    tenant, session, turn, value = import_turn(record, secret, reseal)
                    turns.setdefault((tenant, session), []).append((turn, value))
                    continue
                key, value, entry = import_value(record, secret, reseal)
            except ValueError as exc:  # orjson.JSONDecodeError is one
                counts.reject(f"line {number}: {exc}")
                if isinstance(record, dict) and "turn" in record:
                    broken.add((str(record.get("tenant")), str(record.get("session"))))
                continue
            left_ms = 0 if entry.expires_ms is None else entry.expires_ms - now_in_ms()
            if entry.expires_ms is not None and left_ms <= 0:
                counts.skipped[EXPIRED] += 1
                continue
            await store.commit(key, value, owner, overwrite=True, ttl_ms=left_ms)
            counts.written += 1
    for (tenant, session), recorded in sorted(turns.items()):
        if (tenant, session) in broken:
            continue
        names = {turn.session for turn, _ in recorded}
        if len(names) != 1:
            counts.reject(f"session {session}: its turns name {len(names)} sessions")
            continue
        await sessions.put(tenant, session, names.pop(), [(turn.key, value, turn.masked) for turn, value in recorded])
        counts.sessions += 1
        counts.turns += len(recorded)
    return counts
