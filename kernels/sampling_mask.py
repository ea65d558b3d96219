"""Token masks on logits: the tokens a row may not draw set to -inf before sampling.

The mask is a bitmask of int32 words per row (bit t % 32 of word t // 32 allows token t, the
layout llguidance fills). Unpacking and masking are elementwise, so a row's result depends
on its own logits and mask alone, in every mode and on every device.
"""
from __future__ import annotations

import torch


def apply_token_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (any float dtype), bitmask int32 [B, >= V / 32] -> logits with the
    disallowed tokens at -inf (a new tensor)."""
    batch, vocab = logits.shape
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(batch, -1)[:, :vocab]
    return logits.masked_fill(allowed == 0, float("-inf"))
