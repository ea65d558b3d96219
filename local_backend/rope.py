"""RoPE settings as config.json states them, in either layout, and the frequencies they give.

transformers 5 writes `rope_parameters: {rope_type, rope_theta, factor, ...}`; earlier
versions wrote a top-level `rope_theta` and an optional `rope_scaling: {type | rope_type,
factor, ...}`. Both are read; a checkpoint that names a type this module does not
implement is refused, since running it with plain frequencies gives fluent, wrong text.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from local_backend.errors import CheckpointError

if TYPE_CHECKING:   # the HTTP side reads the settings; only the engine computes frequencies
    import torch

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

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """fp64 [head_dim / 2] angular frequencies."""
        import torch
        base = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        if self.kind == "linear":
            return base / self.get("factor")
        if self.kind == "llama3":
            return _llama3(base, self)
        if self.kind == "yarn":
            return _yarn(base, self, head_dim)
        # "dynamic" rescales theta only once a sequence passes max_position_embeddings, and
        # the engine never serves past it (Engine.max_model_len).
        return base

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


def _llama3(inv_freq: torch.Tensor, rope: Rope) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    import torch
    factor = rope.get("factor")
    low, high = rope.get("low_freq_factor"), rope.get("high_freq_factor")
    old_len = rope.get("original_max_position_embeddings")
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, out)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(inv_freq: torch.Tensor, rope: Rope, head_dim: int) -> torch.Tensor:
    # YaRN: dimensions that turn fewer than beta_slow times over the pretraining length are
    # interpolated (slowed by `factor`), those turning more than beta_fast times kept, and
    # a linear ramp over the dimension index blends the band between.
    import torch
    factor, old_len = rope.get("factor"), rope.get("original_max_position_embeddings")
    fast, slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def dim_turning(turns):   # the (fractional) dimension index that turns `turns` times over old_len
        return head_dim * math.log(old_len / (turns * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_turning(fast), dim_turning(slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)
