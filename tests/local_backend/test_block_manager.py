"""Paged-KV bookkeeping and prefix caching, and the scheduler's chunking and preemption."""
from __future__ import annotations

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.scheduler import Scheduler
from local_backend.engine.sequence import Sequence
from local_backend.sampling_params import SamplingParams

PARAMS = SamplingParams(seed=0, max_tokens=8)


def seq(i, tokens, **kw):
    return Sequence(i, list(tokens), len(tokens), PARAMS, **kw)


def computed(bm, s):
    """Pretend the model computed all of s's tokens."""
    s.num_computed_tokens = len(s)
    bm.register_computed(s)


def test_full_blocks_of_a_shared_prefix_are_reused():
    bm = BlockManager(16, 4)
    a = seq(0, range(10))
    assert bm.allocate(a) and a.num_computed_tokens == 0 and len(a.block_table) == 3
    computed(bm, a)
    b = seq(1, list(range(8)) + [99, 98, 97])
    assert bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_computed_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert (bm.queries, bm.hits) == (4, 2)   # two candidate blocks each; only b found them


def test_the_last_token_is_always_recomputed():
    bm = BlockManager(16, 4)
    a = seq(0, range(8))
    bm.allocate(a)
    computed(bm, a)
    b = seq(1, range(8))
    bm.allocate(b)
    assert b.num_computed_tokens == 4   # the block holding token 7 is recomputed, not shared
    assert b.block_table[1] != a.block_table[1]


def test_a_different_earlier_block_breaks_the_chain():
    bm = BlockManager(16, 4)
    a = seq(0, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a)
    computed(bm, a)
    b = seq(1, [0, 2, 3, 4, 5, 6, 7, 8, 9])   # same second block, different first
    bm.allocate(b)
    assert b.num_computed_tokens == 0


def test_freed_blocks_stay_cached_until_reused_and_lru_goes_first():
    bm = BlockManager(5, 4)
    a = seq(0, range(9))
    bm.allocate(a)
    computed(bm, a)
    bm.release(a)
    assert bm.num_free == 5
    b = seq(1, range(9))
    assert bm.allocate(b) and b.num_computed_tokens == 8   # revived from the free list
    bm.release(b)
    c = seq(2, [50] * 5)      # takes two blocks: the least recently freed, i.e. not the prefix
    bm.allocate(c)
    d = seq(3, range(9))
    assert bm.allocate(d) and d.num_computed_tokens == 8


def test_allocation_fails_cleanly_when_full():
    bm = BlockManager(2, 4)
    a = seq(0, range(12))
    assert not bm.allocate(a)
    assert bm.num_free == 2 and a.block_table == []


def test_audit_sequences_skip_the_prefix_cache():
    bm = BlockManager(16, 4)
    a = seq(0, range(9))
    bm.allocate(a)
    computed(bm, a)
    cold = seq(1, range(9), use_prefix_cache=False)
    bm.allocate(cold)
    assert cold.num_computed_tokens == 0 and not set(cold.block_table) & set(a.block_table)


def test_chunks_end_at_absolute_multiples_of_the_chunk_size():
    s = seq(0, range(100))
    s.num_computed_tokens = 16           # e.g. one block from the prefix cache
    cuts = []
    while s.num_computed_tokens < len(s):
        n = s.next_chunk(32)
        cuts.append(s.num_computed_tokens + n)
        s.num_computed_tokens += n
    assert cuts == [32, 64, 96, 100]


def test_scheduler_mixes_decodes_and_prefill_within_the_budget():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_batch=8, max_batched_tokens=16, chunk_size=8)
    decoding = seq(0, range(5))
    sched.add(decoding)
    first = sched.schedule()
    assert [(x.seq.seq_id, x.num_tokens) for x in first] == [(0, 5)]
    sched.advance(first)
    decoding.token_ids.append(7)
    sched.add(seq(1, range(100, 130)))
    sched.add(seq(2, range(200, 230)))
    step = sched.schedule()
    # one decode token, then whole chunks only: 8 for seq 1; seq 2's 8 would still fit (1 + 8 + 8 > 16: no)
    assert [(x.seq.seq_id, x.num_tokens) for x in step] == [(0, 1), (1, 8)]
    assert list(sched.waiting)[0].seq_id == 2


def test_preemption_frees_the_latest_and_it_restarts_from_scratch():
    bm = BlockManager(4, 4)
    sched = Scheduler(bm, max_batch=4, max_batched_tokens=64, chunk_size=16)
    a, b = seq(0, range(7)), seq(1, range(100, 107))
    sched.add(a)
    sched.add(b)
    step = sched.schedule()
    sched.advance(step)
    sched.register(step)
    for s in (a, b):
        s.token_ids.append(1)        # 8 tokens each: both blocks full
    a.token_ids.append(2)            # a now needs a third block; none is free
    step = sched.schedule()
    assert [x.seq.seq_id for x in step] == [0] and sched.preemptions == 1
    assert b.num_computed_tokens == 0 and list(sched.waiting) == [b]
