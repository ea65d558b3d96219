"""The angular frequencies a model's RoPE settings (local_backend/rope.py) give, in fp64, as
transformers computes them for each rope_type."""
from __future__ import annotations

import math

import torch

from local_backend.rope import Rope


def inv_freq(rope: Rope, head_dim: int) -> torch.Tensor:
    """fp64 [head_dim / 2] angular frequencies."""
    base = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rope.kind == "linear":
        return base / rope.get("factor")
    if rope.kind == "llama3":
        return _llama3(base, rope)
    if rope.kind == "yarn":
        return _yarn(base, rope, head_dim)
    # "dynamic" rescales theta only once a sequence passes max_position_embeddings, and
    # the engine never serves past it (Engine.max_model_len).
    return base


def _llama3(inv_freq: torch.Tensor, rope: Rope) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    factor = rope.get("factor")
    low, high = rope.get("low_freq_factor"), rope.get("high_freq_factor")
    old_len = rope.get("original_max_position_embeddings")
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, out)


def _yarn(inv_freq: torch.Tensor, rope: Rope, head_dim: int) -> torch.Tensor:
    # YaRN: dimensions that turn fewer than beta_slow times over the pretraining length are
    # interpolated (slowed by `factor`), those turning more than beta_fast times kept, and
    # a linear ramp over the dimension index blends the band between.
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
