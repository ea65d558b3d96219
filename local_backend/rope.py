"""RoPE settings as config.json states them, in either layout (the frequencies they give:
models/rope_frequencies.py, on the engine's side; this module needs no torch).

transformers 5 writes `rope_parameters: {rope_type, rope_theta, factor, ...}`; earlier
versions wrote a top-level `rope_theta` and an optional `rope_scaling: {type | rope_type,
factor, ...}`. Both are read; a checkpoint that names a type this module does not
implement is refused, since running it with plain frequencies gives fluent, wrong text.
"""
from __future__ import annotations

import dataclasses
import math

from local_backend.errors import CheckpointError

# The fields each type needs besides rope_theta ("original_max_position_embeddings" may
# also come from the config's max_position_embeddings, as transformers reads it).
REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}


@dataclasses.dataclass(frozen=True)
class Rope:
    kind: str
    theta: float
    params: tuple[tuple[str, float | int | bool], ...] = ()   # the type's fields, sorted by name

    def get(self, name: str, default=None):
        return dict(self.params).get(name, default)

    @property
    def attention_factor(self) -> float:
        """What yarn multiplies cos and sin by (1 for every other type)."""
        if self.kind != "yarn":
            return 1.0
        given = self.get("attention_factor")
        if given is not None:
            return float(given)
        factor, mscale, mscale_all = self.get("factor"), self.get("mscale"), self.get("mscale_all_dim")
        if mscale and mscale_all:
            return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        return _yarn_mscale(factor)


def parse(raw: dict, where: str) -> Rope:
    """The RoPE of a config.json dict; `where` names the file in errors."""
    params = raw.get("rope_parameters")
    field = "rope_parameters"
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        field = "rope_scaling"
        if "rope_theta" in raw:
            params.setdefault("rope_theta", raw["rope_theta"])
    if not isinstance(params, dict):
        raise CheckpointError(f"{where}: {field} must be an object, got {params!r}")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise CheckpointError(f"{where}: {field} gives RoPE per layer type ({sorted(params)}); "
                        "Llama, Qwen2 and Qwen3 use one for every layer")
    params = dict(params)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in REQUIRED:
        raise CheckpointError(f"{where}: {field}.rope_type {kind!r} is not implemented (supported: {sorted(REQUIRED)})")
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = raw.get("rope_theta", 10000.0)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{where}: {field}.partial_rotary_factor {params['partial_rotary_factor']} is not "
                        "implemented: every head dimension is rotated")
    params.pop("partial_rotary_factor", None)
    if kind in ("llama3", "yarn"):
        params.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
    missing = [name for name in REQUIRED[kind] if params.get(name) is None]
    if missing:
        raise CheckpointError(f"{where}: {field} of rope_type {kind!r} lacks {', '.join(missing)}")
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise CheckpointError(f"{where}: {field}.rope_theta must be a positive number, got {theta!r}")
    if kind != "default" and not params["factor"] > 0:
        raise CheckpointError(f"{where}: {field}.factor must be positive, got {params['factor']!r}")
    return Rope(kind, float(theta), tuple(sorted(params.items())))


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
