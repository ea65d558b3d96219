"""What one row may draw next: no end-of-sequence before min_tokens, and under a grammar only
the tokens that keep the answer valid; and which tokens it has seen, for a repetition penalty.
Both are the row's own, computed from its own tokens and applied elementwise
(kernels.apply_token_mask, kernels.apply_repetition_penalty), so a row's tokens never depend
on what else is in the batch.
"""
from __future__ import annotations

import llguidance
import llguidance.numpy
import numpy as np

from local_backend.grammar import Grammars
from local_backend.sampling_params import SamplingParams

# From this many grammar rows in a step, their masks are filled on llguidance's thread pool
# (each row's mask is still its matcher's alone: the pool changes when, not what).
PARALLEL_ROWS = 8
_executor: llguidance.LLExecutor | None = None


class RowMask:
    def __init__(self, params: SamplingParams, eos_ids: frozenset[int], grammars: Grammars | None):
        self.min_tokens = 0 if params.ignore_eos else params.min_tokens
        self.eos = sorted(eos_ids)
        self.matcher = grammars.matcher(params.grammar) if params.grammar is not None else None
        self.penalized = params.repetition_penalty != 1.0

    @staticmethod
    def wanted(params: SamplingParams) -> bool:
        return (params.grammar is not None or (params.min_tokens > 0 and not params.ignore_eos)
                or params.repetition_penalty != 1.0)

    @property
    def follows_tokens(self) -> bool:
        """The mask depends on the last token drawn (a grammar's, the tokens seen), not only on
        how many were."""
        return self.matcher is not None or self.penalized

    def ban_eos(self, row: np.ndarray, generated: int) -> None:
        """Clear the end-of-sequence bits (bit t of word t // 32 for token t) before min_tokens."""
        if generated < self.min_tokens:
            words = row.view(np.uint32)
            for t in self.eos:
                words[t // 32] &= np.uint32(0xFFFFFFFF ^ (1 << (t % 32)))

    def consume(self, token: int) -> bool:
        """Advance past a drawn token; False once the grammar is complete (nothing may follow)."""
        if self.matcher is None:
            return True
        self.matcher.consume_token(token)
        return not self.matcher.is_stopped() and not self.matcher.is_error()


def fill_rows(host: np.ndarray, sampled: list) -> None:
    """The masks of a step's sampled rows into host[:len(sampled)]: every token allowed for a
    free row, each constrained row's from its RowMask."""
    global _executor
    host[:len(sampled)] = -1
    rows = [(j, seq) for j, seq in enumerate(sampled) if seq.mask is not None]
    grammar = [(seq.mask.matcher, j) for j, seq in rows if seq.mask.matcher is not None]
    if len(grammar) >= PARALLEL_ROWS:
        _executor = _executor or llguidance.LLExecutor()
        llguidance.numpy.fill_next_token_bitmask_par(_executor, grammar, host[:len(sampled)])
    else:
        for matcher, j in grammar:
            matcher.unsafe_compute_mask_ptr(host[j].ctypes.data, host[j].nbytes)
    for j, seq in rows:
        seq.mask.ban_eos(host[j], len(seq.token_ids) - seq.num_prompt_tokens)


def fill_seen(host: np.ndarray, sampled: list) -> None:
    """Bit t of row j's words set where sampled[j] holds token t (prompt or answer) and has a
    repetition penalty; zero words elsewhere."""
    host[:len(sampled)] = 0
    for j, seq in enumerate(sampled):
        if seq.mask is not None and seq.mask.penalized:
            ids = np.asarray(seq.token_ids, dtype=np.int64)
            np.bitwise_or.at(host[j].view(np.uint32), ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
