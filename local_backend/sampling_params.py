"""Per-request sampling parameters, as the engine consumes them."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    seed: int                  # fits int64; keys the request's counter-based noise
    max_tokens: int
    temperature: float = 1.0   # 0: exact greedy
    top_p: float = 1.0         # 1.0: off
    top_k: int = 0             # 0: off
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob and the top k
    ignore_eos: bool = False
    defaults: tuple[tuple[str, float | int], ...] = ()  # (name, value) from generation_config.json, for the response
    prompt_logprobs: int | None = None  # None: none; k >= 0: every prompt token's logprob (but the first's) and top k
    min_tokens: int = 0        # end-of-sequence is masked out before this many tokens
    grammar: str | None = None  # llguidance grammar the answer is constrained to (local_backend/grammar.py)
    min_p: float = 0.0         # vLLM's: tokens below min_p x the likeliest's probability are not drawn; 0: off
    repetition_penalty: float = 1.0  # vLLM's: seen tokens' logits divided (positive) or multiplied by it; 1: off
