"""generation_config.json: the checkpoint's end-of-sequence ids and default sampling parameters.

A default applies only to a request that leaves the parameter unset, and every response
names the defaults it used. An explicit `"do_sample": false` is transformers' way of
saying "greedy unless asked otherwise", so it becomes a default temperature of 0.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from local_backend.errors import CheckpointError

FILE = "generation_config.json"


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    eos_token_ids: tuple[int, ...] | None = None            # None: the file does not say
    defaults: tuple[tuple[str, float | int], ...] = ()      # (parameter, value), e.g. ("temperature", 0.6)

    @classmethod
    def from_dir(cls, path: str | Path) -> "GenerationConfig":
        file = Path(path) / FILE
        if not file.exists():
            return cls()
        try:
            raw = json.loads(file.read_text())
        except ValueError as e:
            raise CheckpointError(f"{file}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{file}: must hold a JSON object")
        eos = raw.get("eos_token_id")
        return cls(None if eos is None else token_ids(eos, f"{file}: eos_token_id"), _defaults(raw, file))


def token_ids(value, where: str) -> tuple[int, ...]:
    """An id or a list of ids (config.json and generation_config.json write both)."""
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CheckpointError(f"{where} must be a token id or a list of them, got {value!r}")
    return tuple(ids)


def _defaults(raw: dict, file: Path) -> tuple[tuple[str, float | int], ...]:
    out = {}
    if raw.get("do_sample") is False:
        out["temperature"] = 0.0
    else:
        temperature = raw.get("temperature")
        if temperature is not None:
            out["temperature"] = _number(temperature, f"{file}: temperature", lambda t: 0 <= t <= 2, "in [0, 2]")
    top_p = raw.get("top_p")
    if top_p is not None:
        out["top_p"] = _number(top_p, f"{file}: top_p", lambda p: 0 < p <= 1, "in (0, 1]")
    top_k = raw.get("top_k")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise CheckpointError(f"{file}: top_k must be a non-negative integer, got {top_k!r}")
        out["top_k"] = top_k
    return tuple(sorted(out.items()))


def _number(value, where: str, ok, says: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not ok(value):
        raise CheckpointError(f"{where} must be a number {says}, got {value!r}")
    return float(value)
