"""Token masks on logits: the tokens a row may not draw set to -inf before sampling.

The mask is a bitmask of int32 words per row (bit t % 32 of word t // 32 allows token t, the
layout llguidance fills). Unpacking and masking are elementwise, so a row's result depends
on its own logits and mask alone, in every mode and on every device. min_p's floor needs the
row's largest logit too: a max, exact in any order, so just as much the row's own.
"""
from __future__ import annotations

import torch


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 words [B, W] -> bool [B, vocab], token t's bit t % 32 of word t // 32."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    return ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(bitmask.shape[0], -1)[:, :vocab] != 0


def apply_token_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (any float dtype), bitmask int32 [B, >= V / 32] -> logits with the
    disallowed tokens at -inf (a new tensor)."""
    return logits.masked_fill(~unpack(bitmask, logits.shape[1]), float("-inf"))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """vLLM's (and transformers') repetition_penalty: a seen token's logit divided by the row's
    penalty where positive, multiplied where not, in fp32 and rounded back to the logits' dtype.
    seen: int32 words [B, W] as apply_token_mask's; penalty fp32 [B], 1 for off (exactly the
    logit again)."""
    x = logits.float()
    p = penalty.unsqueeze(-1)
    return torch.where(unpack(seen, logits.shape[1]), torch.where(x > 0, x / p, x * p), x).to(logits.dtype)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """vLLM's min_p: the tokens whose probability after temperature is below min_p times the
    likeliest's set to -inf, i.e. logit < max + temperature * log(min_p). Rows with min_p 0 or
    temperature 0 (greedy) are left as they are. logits [B, V]; min_p, temperature fp32 [B]."""
    on = (min_p > 0) & (temperature > 0)
    floor = logits.float().amax(dim=-1) + temperature * torch.log(torch.where(on, min_p, 1.0))
    floor = torch.where(on, floor, float("-inf")).unsqueeze(-1)
    return logits.masked_fill(logits.float() < floor, float("-inf"))
