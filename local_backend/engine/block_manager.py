"""The paged KV cache's bookkeeping: fixed-size blocks, reference counts, prefix caching.

A full block is identified by a hash chained over every token before it, so two
sequences share a block only when their whole prefixes agree. The block's tokens are
kept and compared on a hit, so a hash collision can never hand one request another's
KV. Freed blocks keep their hash until they are reused (least recently freed first), so
a finished conversation's prefix stays warm for its next turn.
"""
from __future__ import annotations

import collections
import dataclasses

import xxhash

from local_backend.engine.sequence import Sequence


def block_hash(prev: int, tokens: list[int]) -> int:
    h = xxhash.xxh3_64(prev.to_bytes(8, "little"))
    h.update(b"".join(t.to_bytes(4, "little") for t in tokens))
    return h.intdigest()


@dataclasses.dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    tokens: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}   # hash -> block id
        self.queries = 0                   # prefix-cache lookups, in blocks (for metrics)
        self.hits = 0

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return len(self.blocks) - len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.cached.get(block.hash) == block_id:
            del self.cached[block.hash]
        block.hash, block.tokens, block.ref_count = None, (), 1
        return block_id

    def _lookup(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block id, hash) of the cached blocks that hold seq's prefix. The last token is
        never served from the cache: the step that computes it yields the first sample."""
        bs, hits, prev = self.block_size, [], 0
        for i in range((len(seq) - 1) // bs):
            tokens = seq.token_ids[i * bs:(i + 1) * bs]
            prev = block_hash(prev, tokens)
            block_id = self.cached.get(prev)
            if block_id is None or self.blocks[block_id].tokens != tuple(tokens):
                break
            hits.append((block_id, prev))
        return hits

    def allocate(self, seq: Sequence) -> bool:
        """Give a waiting sequence blocks for all its tokens, reusing cached prefix blocks.
        False (and nothing changed) when the free blocks do not suffice."""
        hits = self._lookup(seq) if seq.use_prefix_cache else []
        revived = sum(1 for block_id, _ in hits if self.blocks[block_id].ref_count == 0)
        if self.blocks_needed(len(seq)) - len(hits) > self.num_free - revived:
            return False
        if seq.use_prefix_cache:
            self.queries += (len(seq) - 1) // self.block_size
            self.hits += len(hits)
        for block_id, h in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
        seq.num_computed_tokens = len(hits) * self.block_size
        while len(seq.block_table) < self.blocks_needed(len(seq)):
            seq.block_table.append(self._take_free())
        return True

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        while len(seq.block_table) < self.blocks_needed(num_tokens):
            seq.block_table.append(self._take_free())

    def release(self, seq: Sequence) -> None:
        # Reverse order: a sequence's last blocks are the least likely to be shared, so
        # they are reused first and the common prefix survives longest.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0

    def register_computed(self, seq: Sequence) -> None:
        """Publish seq's newly completed full blocks to the prefix cache."""
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            tokens = seq.token_ids[i * bs:(i + 1) * bs]
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else 0, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if h not in self.cached:
                self.cached[h] = block.block_id
                block.hash, block.tokens = h, tuple(tokens)
