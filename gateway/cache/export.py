"""Cache entries in and out of a store as JSONL: golden answers a team commits and replays.

One line per entry, sorted by key, each line's fields sorted too, so that two exports of
the same cache are the same file and a diff shows only real changes:

    {"entry": {"body": ..., "model": ..., "sse": ..., "v": 1}, "key": "dg1:...", "mac": "..."}

When a drift policy `rotate` has moved some model's keys to a newer namespace, the file
starts with the namespace epochs the keys were made in, and import raises the ledger's
epochs to them; without that line a fresh Redis would look for the entries under their
first namespace and replay would miss every one:

    {"epochs": {"openai/gpt-4o-2024-08-06": 2}}

Keys are signed with the gateway's secret, so entries are only ever found by a gateway
that has the secret they were exported under: CI that replays golden answers runs with
the same secret as the gateway that recorded them. Import therefore verifies each entry's
MAC with the importing secret and refuses the ones that fail (edited by hand, or exported
under another secret: their keys could never match a request anyway). `--reseal` trusts
the file instead and seals every entry anew, for a golden file edited on purpose.
"""
from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass, field
from typing import IO

import orjson
from tqdm import tqdm

from gateway.cache.entry import CorruptEntry, Sealer, decode, encode
from gateway.policy.keys import KEY_PREFIX, verify_entry
from gateway.cache.store import Store

BATCH = 64  # concurrent reads while exporting
MAC_LEN = Sealer.MAC_LEN
_KEY_LEN = len(KEY_PREFIX) + 64


@dataclass
class Counts:
    written: int = 0
    skipped: int = 0  # gone between listing and reading, or failing their MAC in the store
    rejected: int = 0
    problems: list[str] = field(default_factory=list)  # the first few, for the message
    epochs: dict[str, int] = field(default_factory=dict)  # namespace epochs an imported file names

    def reject(self, problem: str) -> None:
        self.rejected += 1
        if len(self.problems) < 5:
            self.problems.append(problem)


def export_line(key: str, value: bytes, secret: bytes) -> bytes | None:
    """The JSONL line for a stored value; None when it fails its MAC (never exported)."""
    mac, raw = value[:MAC_LEN].decode("ascii", "replace"), value[MAC_LEN:]
    if not verify_entry(secret, key, raw, mac):
        return None
    return orjson.dumps({"key": key, "mac": mac, "entry": orjson.loads(raw)}, option=orjson.OPT_SORT_KEYS) + b"\n"


def epochs_line(epochs: dict[str, int]) -> bytes:
    return orjson.dumps({"epochs": epochs}, option=orjson.OPT_SORT_KEYS) + b"\n"


def read_epochs(record: dict) -> dict[str, int]:
    epochs = record["epochs"]
    if (len(record) != 1 or not isinstance(epochs, dict)
            or not all(type(v) is int and v > 0 for v in epochs.values())):
        raise ValueError('an "epochs" line holds one object of model -> positive integer')
    return epochs


def import_value(record: dict, secret: bytes, reseal: bool) -> tuple[str, bytes]:
    """(key, value to store) for an entry line; ValueError saying what is wrong with it."""
    if not {"key", "mac", "entry"} <= record.keys():
        raise ValueError("not an object with key, mac and entry")
    key, mac = record["key"], record["mac"]
    if not isinstance(key, str) or len(key) != _KEY_LEN or not key.startswith(KEY_PREFIX):
        raise ValueError(f"key {str(key)[:80]!r} is not a {KEY_PREFIX} cache key")
    try:
        entry = decode(orjson.dumps(record["entry"]))
    except CorruptEntry as exc:
        raise ValueError(str(exc)) from None
    if reseal:
        return key, Sealer(secret).seal(key, entry)
    raw = encode(entry)
    if not verify_entry(secret, key, raw, mac):
        raise ValueError(f"entry {key} fails its MAC check under this secret (exported under another secret, "
                         f"or edited; --reseal trusts the file)")
    return key, mac.encode() + raw


async def export_entries(store: Store, out: IO[bytes], secret: bytes, epochs: dict[str, int],
                         progress: bool = True) -> Counts:
    counts = Counts()
    if epochs:
        out.write(epochs_line(epochs))
    keys = sorted([key async for key in store.keys()])
    with tqdm(total=len(keys), unit="entry", desc="export", disable=not progress) as bar:
        for at in range(0, len(keys), BATCH):
            batch = keys[at:at + BATCH]
            for key, value in zip(batch, await asyncio.gather(*(store.get(key) for key in batch))):
                line = None if value is None else export_line(key, value, secret)
                if line is None:
                    counts.skipped += 1
                else:
                    out.write(line)
                    counts.written += 1
            bar.update(len(batch))
    return counts


async def import_entries(store: Store, source: IO[bytes], secret: bytes, *, reseal: bool = False,
                         progress: bool = True) -> Counts:
    """Every valid entry line is stored, replacing what is there: the file is the truth. The
    epochs it names come back in the counts, for the caller to raise the ledger's to."""
    counts = Counts()
    owner = secrets.token_hex(8)  # a fill-lock owner no one holds: commit then only writes
    size = os.fstat(source.fileno()).st_size
    with tqdm(total=size, unit="B", unit_scale=True, desc="import", disable=not progress) as bar:
        for number, line in enumerate(source, 1):
            bar.update(len(line))
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
                if "epochs" in record:
                    counts.epochs.update(read_epochs(record))
                    continue
                key, value = import_value(record, secret, reseal)
            except ValueError as exc:  # orjson.JSONDecodeError is one
                counts.reject(f"line {number}: {exc}")
                continue
            await store.commit(key, value, owner, overwrite=True)
            counts.written += 1
    return counts
