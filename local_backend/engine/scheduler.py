"""Continuous batching: which sequences run in the next engine step, and how many tokens each.

Every step mixes decodes (one token each) with prefill chunks of waiting prompts, within
a sequence cap and a token budget. A prompt is cut at absolute multiples of the chunk
size, and a chunk is never shortened to fit the budget (it waits a step instead), so
the cut never depends on the load. When the KV cache runs out, the latest-admitted
sequence is preempted and later recomputed from its tokens.
"""
from __future__ import annotations

import collections
import dataclasses

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.sequence import Sequence, Status


@dataclasses.dataclass
class Scheduled:
    seq: Sequence
    num_tokens: int              # tokens computed this step, starting at seq.num_computed_tokens


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch: int, max_batched_tokens: int, chunk_size: int):
        self.blocks = blocks
        self.max_batch = max_batch
        self.max_batched_tokens = max_batched_tokens
        self.chunk_size = chunk_size
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is (finished or aborted) and free its blocks."""
        if seq.status is Status.FINISHED:
            return
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.status = Status.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def schedule(self) -> list[Scheduled]:
        out: list[Scheduled] = []
        budget = self.max_batched_tokens
        block_size = self.blocks.block_size
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or seq.last_in_flight:   # preempted for an earlier one, or done
                continue
            n = seq.next_chunk(self.chunk_size)
            if n > budget:
                continue
            # Most steps most sequences fit in the blocks they hold: nothing to look up.
            if seq.num_computed_tokens + n > len(seq.block_table) * block_size:
                while not self.blocks.can_grow(seq, seq.num_computed_tokens + n):
                    victim = self.running[-1]
                    self._preempt(victim)
                    if victim is seq:
                        break
                if seq.status is Status.RUNNING:
                    self.blocks.grow(seq, seq.num_computed_tokens + n)
            if seq.status is Status.RUNNING:
                out.append(Scheduled(seq, n))
                budget -= n
        while self.waiting and len(self.running) < self.max_batch and not any(s.alone for s in self.running):
            seq = self.waiting[0]
            if (seq.alone and self.running) or seq.last_in_flight:   # the latter ends when its step is read
                break
            # The first chunk is at most this long, whatever the prefix cache holds.
            if min(len(seq), self.chunk_size) > budget or not self.blocks.allocate(seq):
                break
            n = seq.next_chunk(self.chunk_size)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.append(Scheduled(seq, n))
            budget -= n
            if seq.alone:
                break
        return out

    def advance(self, scheduled: list[Scheduled]) -> None:
        """A step is queued: its tokens count as computed (the next step may follow it at once)."""
        for item in scheduled:
            item.seq.num_computed_tokens += item.num_tokens

    def register(self, scheduled: list[Scheduled]) -> None:
        """Publish the blocks a finished step filled to the prefix cache. Called once the tokens
        of every computed position are known, which the step in flight after it may not be."""
        block_size = self.blocks.block_size
        for item in scheduled:
            seq = item.seq
            if seq.status is Status.RUNNING and seq.num_computed_tokens // block_size > len(seq.block_hashes):
                self.blocks.register_computed(seq)
