"""What one row may draw next: no end-of-sequence before min_tokens, and under a grammar only
the tokens that keep the answer valid. The mask is the row's own, computed from its own tokens
and applied elementwise (kernels.apply_token_mask), so a row's tokens never depend on what
else is in the batch.
"""
from __future__ import annotations

import numpy as np

from local_backend.grammar import Grammars
from local_backend.sampling_params import SamplingParams


class RowMask:
    def __init__(self, params: SamplingParams, eos_ids: frozenset[int], grammars: Grammars | None):
        self.min_tokens = 0 if params.ignore_eos else params.min_tokens
        self.eos = sorted(eos_ids)
        self.matcher = grammars.matcher(params.grammar) if params.grammar is not None else None

    @staticmethod
    def wanted(params: SamplingParams) -> bool:
        return params.grammar is not None or (params.min_tokens > 0 and not params.ignore_eos)

    @property
    def follows_tokens(self) -> bool:
        """The mask depends on the last token drawn (a grammar's), not only on how many were."""
        return self.matcher is not None

    def fill(self, row: np.ndarray, generated: int) -> None:
        """Write the allowed set (bit t of word t // 32 for token t) into `row`, int32 words."""
        if self.matcher is not None:
            self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        else:
            row[:] = -1
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
