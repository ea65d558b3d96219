"""One request's tokens and where it stands in the engine."""
from __future__ import annotations

import dataclasses
import enum

from local_backend.sampling_params import SamplingParams

# A generated token the host has not read yet: the step that samples it is still on the GPU,
# and the next step, queued meanwhile, takes it from there (llm_engine.py, model_runner.py).
PENDING = -1


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)   # identity: two requests with equal tokens are still two
class Sequence:
    seq_id: int
    token_ids: list[int]           # prompt, then every generated token
    num_prompt_tokens: int
    params: SamplingParams
    request_id: int | None = None  # the HTTP side's number for it; None for the engine's own (audits)
    use_prefix_cache: bool = True  # False for audit re-runs, which must start cold
    alone: bool = False            # True for audit re-runs: scheduled in a batch of one
    status: Status = Status.WAITING
    num_computed_tokens: int = 0   # tokens whose K/V are in the cache
    block_table: list[int] = dataclasses.field(default_factory=list)
    block_hashes: list[int] = dataclasses.field(default_factory=list)  # chained hashes of full computed blocks
    prompt_logprobs: list = dataclasses.field(default_factory=list)    # Samples of prompt tokens 1.., as scored
    last_in_flight: bool = False   # its last token (by max_tokens or the context) is being sampled: nothing to schedule
    mask: object = None            # engine/row_mask.RowMask when its draws are constrained

    def drop_pending(self) -> None:
        """Forget the tokens still being sampled (the sequence ended before they were read)."""
        while self.token_ids and self.token_ids[-1] == PENDING:
            self.token_ids.pop()

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def next_chunk(self, chunk_size: int) -> int:
        """Tokens to compute in the next step: up to the next multiple of chunk_size.

        Chunk boundaries sit at absolute positions, so how a prompt is cut never depends
        on what else is scheduled or on how much of it came from the prefix cache.
        """
        remaining = len(self.token_ids) - self.num_computed_tokens
        return min(remaining, chunk_size - self.num_computed_tokens % chunk_size)
