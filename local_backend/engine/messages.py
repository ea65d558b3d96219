"""What the engine and the HTTP side tell each other, as plain data (no torch): the HTTP side
may be another process, which gets these pickled through a pipe (engine_process.py).

To the engine, commands: ("add", request_id, prompt, params) | ("abort", request_id) | ("stop",),
and ("read",) over a pipe (outbox.py). From it, once: EngineInfo; then one Lot per step.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple


# A lot holds one Sample and one Event per sequence of the step: at 256 sequences, building
# and pickling them as frozen dataclasses took the engine more host time than scheduling and
# staging together (bench/results/backend_host_step.md); tuples are built and pickled in C.
class Sample(NamedTuple):
    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()   # (token id, logprob), best first
    rank: int | None = None                   # 1 + the tokens likelier than this one (prompt logprobs)


class Event(NamedTuple):
    sample: Sample | None = None       # None only when max_tokens is 0 (scoring a prompt)
    finish_reason: str | None = None   # "stop" | "length" on the last token
    error: str | None = None           # the step failed; no more events follow
    prompt_logprobs: list[Sample] | None = None   # on the first event, when asked: prompt tokens 1..


@dataclasses.dataclass(frozen=True)
class StepStats:
    sequences: int
    generated: int
    seconds: float
    kv_blocks_used: int
    queue_depth: int
    prefix_queries: int   # full prompt blocks looked up in the prefix cache since the last StepStats
    prefix_hits: int
    gpu_seconds: dict     # phase ("forward", "sampler") -> seconds; empty without a GPU
    handoff_wait: float   # since the last StepStats, waiting for the HTTP side to read a lot (outbox.py)


@dataclasses.dataclass
class Lot:
    """A step's output: the events, and what the HTTP side's metrics need (the engine keeps none)."""
    events: list = dataclasses.field(default_factory=list)   # (request_id, Event), in order
    steps: list[StepStats] = dataclasses.field(default_factory=list)
    audits: list[str] = dataclasses.field(default_factory=list)   # "match" | "mismatch"
    error: str | None = None   # why a step failed, when one did

    def __bool__(self) -> bool:
        return bool(self.events or self.steps or self.audits or self.error)

    def __getstate__(self):
        # Pickled, a NamedTuple calls back into Python for its arguments; plain tuples do not.
        events = [(r, e.sample and tuple(e.sample), e.finish_reason, e.error,
                   e.prompt_logprobs and [tuple(s) for s in e.prompt_logprobs]) for r, e in self.events]
        return events, self.steps, self.audits, self.error

    def __setstate__(self, state) -> None:
        events, self.steps, self.audits, self.error = state
        self.events = [(r, Event(s and Sample._make(s), finish, error, p and [Sample._make(x) for x in p]))
                       for r, s, finish, error, p in events]


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What the HTTP side needs to know of a loaded engine."""
    fingerprint: str
    kernel_version: str
    toolchain: str
    device: str
    dtype: str
    num_blocks: int
    block_size: int
    max_model_len: int
    max_batch: int
    prefix_caching: bool

    def capacity_error(self, prompt_len: int, max_tokens: int) -> str | None:
        total = prompt_len + max_tokens
        if total > self.max_model_len:
            return (f"prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) is {total} tokens, "
                    f"more than this model's context of {self.max_model_len}")
        if -(-total // self.block_size) > self.num_blocks:
            return f"{total} tokens do not fit in the KV cache ({self.num_blocks * self.block_size} tokens)"
        return None
