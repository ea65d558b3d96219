"""Schemas already checked and compiled in this process, by a digest of their JSON bytes.

A coding agent sends the same two dozen tool schemas with every request; checking them
against the draft 2020-12 metaschema costs milliseconds each, which made a Claude Code
request cost ~50 ms to prepare, its cache hits included. Here each distinct schema is
checked once and compiled once, and later requests pay for serialising and hashing it.

The digest is BLAKE2b, so that no client can craft a schema that shares an entry with
another; what is remembered is bounded by entries and by JSON bytes, least recently used
dropped first. A schema that cannot be keyed exactly is checked every time, never
misfiled: orjson writes NaN and infinities as null (JSON on the wire holds neither, a TOML
config can), and refuses the non-JSON types a config could hold.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jsonschema
import orjson
from jsonschema import Draft202012Validator

_EXACT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


@dataclass
class _Entry:
    size: int
    schema: Any  # a private copy, parsed from the bytes: the request's own dict may change after
    error: jsonschema.SchemaError | None
    validator: Draft202012Validator | None = None


def _bytes(schema: Any) -> bytes | None:
    """The schema's JSON bytes when they stand for it alone, else None."""
    try:
        data = orjson.dumps(schema, option=_EXACT)
    except orjson.JSONEncodeError:
        return None
    if b"null" in data and orjson.loads(data) != schema:  # a NaN or infinity became null
        return None
    return data


class SchemaMemo:
    """Whether each schema is valid, and its validator, remembered by digest.
    `checks` and `compiles` count the metaschema checks and validators built, for tests."""

    def __init__(self, entries: int = 1024, budget: int = 16 * 2**20) -> None:
        self.entries, self.budget = entries, budget
        self.checks = self.compiles = 0
        self._held = 0
        self._memo: OrderedDict[bytes, _Entry] = OrderedDict()

    def _entry(self, schema: Any) -> _Entry:
        data = _bytes(schema)
        if data is None or len(data) > self.budget:
            return self._checked(schema, 0)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        entry = self._memo.get(digest)
        if entry is not None:
            self._memo.move_to_end(digest)
            return entry
        entry = self._checked(orjson.loads(data), len(data))
        self._memo[digest] = entry
        self._held += entry.size
        while len(self._memo) > self.entries or self._held > self.budget:
            self._held -= self._memo.popitem(last=False)[1].size
        return entry

    def _checked(self, schema: Any, size: int) -> _Entry:
        self.checks += 1
        try:
            Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            return _Entry(size, schema, exc)
        return _Entry(size, schema, None)

    def error(self, schema: Any) -> jsonschema.SchemaError | None:
        """Why `schema` is not a valid draft 2020-12 schema, or None."""
        return self._entry(schema).error

    def validator(self, schema: Any) -> Draft202012Validator:
        """The schema's validator, formats checked; for a schema `error` passed."""
        entry = self._entry(schema)
        if entry.validator is None:
            self.compiles += 1
            entry.validator = Draft202012Validator(entry.schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return entry.validator


SCHEMAS = SchemaMemo()
