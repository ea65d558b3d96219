"""Paged attention: accuracy against the fp64 reference, and bit-invariance of a
sequence's rows across batches, positions, chunkings, page placements and paths.

On the CPU the Triton kernels run under TRITON_INTERPRET=1 at tiny sizes in
fp16/fp32 (the interpreter's bf16 dot is wrong), with the one-tile band cut to
two tiles so that every sequence crosses both kinds of split; on a GPU the same
properties are checked at real sizes in bf16 with the production splits. Each
step takes the split or the fold path at random, and split programs take a
random number of splits.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

import kernels
from kernels.attention import paged_attention, paged_attention_reference, store_kv
from kernels.attention_torch import paged_attention_per_sequence, per_sequence_plan, store_kv_torch
from kernels import attention_triton
from kernels.attention_triton import BLOCK_N, WIDE_FROM, WIDE_TILES, paged_attention_triton

HAS_CUDA = torch.cuda.is_available()
# Seven KV tiles, the last one partial: two one-tile splits, a 2-tile chunk, then a 3-tile wide split.
CPU_LENGTH = 6 * BLOCK_N + 37
GPU_LENGTH = (WIDE_FROM + 2 * WIDE_TILES) * BLOCK_N + 333  # into the wide splits by two and a part


@pytest.fixture(autouse=True)
def small_band_on_cpu(device, monkeypatch):
    if device == "cpu":
        monkeypatch.setattr(attention_triton, "BAND_TILES", 2)
        monkeypatch.setattr(attention_triton, "CHUNK_TILES", 2)
        monkeypatch.setattr(attention_triton, "WIDE_FROM", 4)
        monkeypatch.setattr(attention_triton, "WIDE_TILES", 3)


@dataclass
class Seq:
    q: torch.Tensor   # [L, H, D] one query per position
    k: torch.Tensor   # [L, Hkv, D]
    v: torch.Tensor


def _seq(length, H, h_kv, D, dtype, device, gen) -> Seq:
    def draw(*shape):
        return torch.randn(shape, generator=gen, device=gen.device).to(device=device, dtype=dtype)
    return Seq(draw(length, H, D), draw(length, h_kv, D), draw(length, h_kv, D))


class Cache:
    """A paged KV cache handing out pages in a random order, poisoned with NaN."""

    def __init__(self, num_blocks, block_size, h_kv, D, dtype, device, rng):
        shape = (num_blocks, block_size, h_kv, D)
        self.k = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.v = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.block_size = block_size
        self.free = list(range(num_blocks))
        rng.shuffle(self.free)

    def pages(self, length) -> list[int]:
        n = -(-length // self.block_size)
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def slots(self, pages, start, stop) -> list[int]:
        return [pages[p // self.block_size] * self.block_size + p % self.block_size for p in range(start, stop)]


def _attend(cache, batch, split_per_program, splits_per_program):
    """One engine step. batch: (seq, pages, done, q_len) each; writes the new KV, then attends."""
    device = cache.k.device
    width = max(len(pages) for _, pages, _, _ in batch)
    q, k, v, slots, tables, cu, kv_lens = [], [], [], [], [], [0], []
    for seq, pages, done, q_len in batch:
        q.append(seq.q[done: done + q_len])
        k.append(seq.k[done: done + q_len])
        v.append(seq.v[done: done + q_len])
        slots += cache.slots(pages, done, done + q_len)
        tables.append(pages + [-1] * (width - len(pages)))
        cu.append(cu[-1] + q_len)
        kv_lens.append(done + q_len)
    store_kv(torch.cat(k), torch.cat(v), cache.k, cache.v, torch.tensor(slots, dtype=torch.int64, device=device))
    args = (torch.cat(q), cache.k, cache.v, torch.tensor(tables, dtype=torch.int32, device=device),
            torch.tensor(cu, dtype=torch.int32, device=device),
            torch.tensor(kv_lens, dtype=torch.int32, device=device))
    o = paged_attention_triton(*args, batch[0][0].q.shape[-1] ** -0.5, max_q_len=max(cu[i + 1] - cu[i] for i in range(len(batch))),
                               max_kv_len=max(kv_lens), split_per_program=split_per_program,
                               splits_per_program=splits_per_program)
    return o, args, cu


def _rows_in_scenario(target, chunks, rng, make_seq, cache, other_len, max_others, cached_prefix):
    """Run `target` through the given prompt chunking, each step inside a random batch.

    Returns its output rows for every position, in order. Other sequences get
    random cached prefixes, query lengths (decode or prefill) and batch slots.
    """
    pages = cache.pages(target.q.shape[0])
    if cached_prefix:  # a prefix written by an earlier request: KV only, no outputs of ours
        store_kv(target.k[:cached_prefix], target.v[:cached_prefix], cache.k, cache.v,
                 torch.tensor(cache.slots(pages, 0, cached_prefix), dtype=torch.int64, device=cache.k.device))
    done, rows = cached_prefix, []
    for q_len in chunks:
        others = []
        for _ in range(rng.randint(0, max_others)):
            o_len = rng.randint(1, other_len)
            o_q = rng.choice([1, 1, rng.randint(1, o_len)])
            seq = make_seq(o_len)
            o_pages = cache.pages(o_len)
            store_kv(seq.k[: o_len - o_q], seq.v[: o_len - o_q], cache.k, cache.v,
                     torch.tensor(cache.slots(o_pages, 0, o_len - o_q), device=cache.k.device, dtype=torch.int64))
            others.append((seq, o_pages, o_len - o_q, o_q))
        at = rng.randint(0, len(others))
        batch = others[:at] + [(target, pages, done, q_len)] + others[at:]
        o, _, cu = _attend(cache, batch, rng.random() < 0.5, rng.choice([None, (1, 1), (2, 1), (3, 2)]))
        rows.append(o[cu[at]: cu[at + 1]])
        done += q_len
    return torch.cat(rows)


def _random_chunks(length, rng) -> list[int]:
    """A prompt split at random points, often ending in a few single-token decode steps."""
    decode = rng.randint(0, 3)
    cuts = sorted(rng.sample(range(1, length - decode), rng.randint(0, 3))) if length - decode > 1 else []
    bounds = [0] + cuts + [length - decode]
    return [b - a for a, b in zip(bounds, bounds[1:]) if b > a] + [1] * decode


def _invariance(G, block_size, dtype, device, gen, *, length, other_len, scenarios, max_others, H_kv, D):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    rng = random.Random(seed)
    draw_on = torch.Generator(device).manual_seed(seed)  # drawing on the GPU keeps real sizes fast
    H = G * H_kv
    make_seq = lambda n: _seq(n, H, H_kv, D, dtype, device, draw_on)  # noqa: E731
    target = make_seq(length)
    steps = 7  # at most 4 prompt chunks and 3 decode steps (_random_chunks)
    per_scenario = length // block_size + 1 + steps * max_others * (other_len // block_size + 1)
    cache = Cache((scenarios + 1) * per_scenario, block_size, H_kv, D, dtype, device, rng)
    baseline = _rows_in_scenario(target, [length], rng, make_seq, cache, other_len, 0, 0)
    for _ in range(scenarios):
        cached = rng.choice([0, rng.randint(1, length - 1)])
        chunks = _random_chunks(length - cached, rng)
        rows = _rows_in_scenario(target, chunks, rng, make_seq, cache, other_len, max_others, cached)
        # Positions of the cached prefix produce no rows in this scenario.
        assert torch.equal(rows, baseline[cached:]), f"chunks={chunks} cached={cached}"
    return target, baseline


def block_tables(order: list[int], kv_lens: list[int], block_size: int, width: int | None = None) -> list[list[int]]:
    """Each sequence's pages taken in turn from `order`, each row padded to `width` (default: the
    longest) with a block id past the cache: junk past a sequence's end is never read."""
    counts = [-(-n // block_size) for n in kv_lens]
    width = width or max(counts)
    tables, used = [], 0
    for n in counts:
        tables.append(order[used: used + n] + [len(order) + 99] * (width - n))
        used += n
    return tables


def _rel_err(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _reference_rows(target, block_size, device, rows_per_call=1024):
    """fp64 reference for one sequence prefilled alone, contiguous pages. Rows go in blocks
    (each a chunk over the prefix before it): whole, the fp64 scores of 32 heads at 9549
    positions would be 23 GB, three times over."""
    length, h_kv, D = target.k.shape
    n = -(-length // block_size)
    kc = torch.zeros(n * block_size, h_kv, D, dtype=torch.float64, device=device)
    vc = torch.zeros_like(kc)
    kc[:length], vc[:length] = target.k.double(), target.v.double()
    table = torch.arange(n, dtype=torch.int32, device=device)[None]
    return torch.cat([paged_attention_reference(
        target.q[a: a + rows_per_call].double(), kc.view(n, block_size, h_kv, D), vc.view(n, block_size, h_kv, D),
        table, torch.tensor([0, min(rows_per_call, length - a)], dtype=torch.int32, device=device),
        torch.tensor([min(a + rows_per_call, length)], dtype=torch.int32, device=device),
        compute_dtype=torch.float64) for a in range(0, length, rows_per_call)])


# -- CPU (interpreter) at tiny sizes; also runs on a GPU ---------------------------------------

# G = 16: a decode query's rows span both halves of a 16-row group, so no _pair_rows there.
# G = 3, 5, 7 do not divide a tile's rows: its last rows are padding, and a decode query's
# rows may straddle the two halves of a 16-row group.
@pytest.mark.parametrize("G,block_size,dtype", [
    (1, 16, torch.float16), (4, 64, torch.float16), (8, 16, torch.float16), (16, 16, torch.float16),
    (4, 16, torch.float32), (3, 16, torch.float16), (5, 64, torch.float16), (7, 16, torch.float32)])
def test_rows_are_bit_invariant_and_accurate(G, block_size, dtype, device, gen):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("fp32 dots run as tf32 on the GPU; the GPU test covers bf16")
    target, rows = _invariance(G, block_size, dtype, device, gen, length=CPU_LENGTH,
                               other_len=6 * BLOCK_N, scenarios=3, max_others=2, H_kv=2 if G < 8 else 1, D=32)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert _rel_err(rows, _reference_rows(target, block_size, device)) < tol


def test_store_kv_writes_its_slots_and_skips_padding(device, gen):
    num_blocks, block_size, h_kv, D, T = 6, 16, 2, 32, 40
    k = torch.randn(T, h_kv, D, generator=gen).to(device)
    v = torch.randn(T, h_kv, D, generator=gen).to(device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:T].to(device)
    slots[::7] = -1
    before = torch.randn(2, num_blocks, block_size, h_kv, D, generator=gen).to(device)
    got_k, got_v = before.clone()
    store_kv(k, v, got_k, got_v, slots)
    keep = slots >= 0
    for got, new, old in ((got_k, k, before[0]), (got_v, v, before[1])):
        expect = old.clone().flatten(0, 1)
        expect[slots[keep]] = new[keep]
        assert torch.equal(got.flatten(0, 1), expect)  # written where asked, untouched elsewhere
        assert not torch.equal(got, old)
    torch_k, torch_v = before.clone()
    store_kv_torch(k, v, torch_k, torch_v, slots)
    assert torch.equal(torch_k, got_k) and torch.equal(torch_v, got_v)


@pytest.mark.parametrize("mode", ["invariant", "standard"])
def test_public_entry_point_matches_reference_in_each_mode(mode, device, gen):
    """A mixed batch (prefill, chunk over a cached prefix, decode) through kernels.paged_attention."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    H, h_kv, D, block_size = 8, 2, 32, 16
    kv_lens, q_lens = [150, 61, 9, 40], [150, 20, 1, 1]
    num_blocks = sum(-(-n // block_size) for n in kv_lens) + 3
    kc = torch.randn(num_blocks, block_size, h_kv, D, generator=gen).to(device, dtype)
    vc = torch.randn(num_blocks, block_size, h_kv, D, generator=gen).to(device, dtype)
    tables = block_tables(torch.randperm(num_blocks, generator=gen).tolist(), kv_lens, block_size)
    q = torch.randn(sum(q_lens), H, D, generator=gen).to(device, dtype)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    args = (q, kc, vc, torch.tensor(tables, dtype=torch.int32, device=device), cu,
            torch.tensor(kv_lens, dtype=torch.int32, device=device))
    with kernels.mode(mode):
        out = paged_attention(*args)
    ref = paged_attention_reference(*(a.double() if a.is_floating_point() else a for a in args),
                                    compute_dtype=torch.float64)
    assert out.dtype == dtype and out.shape == q.shape
    assert _rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("G", [1, 3, 4])
def test_cpu_backend_path_matches_reference(G, gen, monkeypatch):
    """Without the interpreter the CPU backend runs one SDPA call per sequence: a mixed batch
    (prefill, chunk over a cached prefix, decode; pages consecutive and shuffled) against the
    fp64 reference."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # set under the CPU suite, absent on a GPU
    h_kv, D, block_size = 2, 32, 16
    kv_lens, q_lens = [150, 61, 9, 40], [150, 20, 1, 1]
    num_blocks = sum(-(-n // block_size) for n in kv_lens)
    kc, vc = torch.randn(2, num_blocks, block_size, h_kv, D, generator=gen)
    order = list(range(10)) + torch.randperm(num_blocks - 10, generator=gen).add(10).tolist()  # first: in order
    tables = block_tables(order, kv_lens, block_size)
    q = torch.randn(sum(q_lens), G * h_kv, D, generator=gen)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    args = (q, kc, vc, torch.tensor(tables, dtype=torch.int32), cu, torch.tensor(kv_lens, dtype=torch.int32))
    out = paged_attention(*args)
    ref = paged_attention_reference(*(a.double() if a.is_floating_point() else a for a in args),
                                    compute_dtype=torch.float64)
    assert _rel_err(out, ref) < 1e-6


def test_cpu_path_is_causal_gives_the_mask_s_bits(gen):
    """The CPU path hands a prompt's first chunk (queries over all its positions) to SDPA's
    is_causal instead of a mask: the same bits, past a key block of the CPU kernel (512) and
    with prompt lengths that leave partial blocks."""
    h_kv, G, D, block_size = 3, 3, 64, 16
    for kv_len in (37, 700):
        blocks = -(-kv_len // block_size)
        kc, vc = torch.randn(2, blocks, block_size, h_kv, D, generator=gen)
        q = torch.randn(kv_len, G * h_kv, D, generator=gen)
        batch = (torch.arange(blocks, dtype=torch.int32)[None], torch.tensor([0, kv_len], dtype=torch.int32),
                 torch.tensor([kv_len], dtype=torch.int32))
        plan = per_sequence_plan(kc, *batch)
        assert plan[0][4] is None   # is_causal stands in
        positions = torch.arange(kv_len)
        masked = [plan[0][:4] + (positions <= positions[:, None],)]
        assert torch.equal(paged_attention_per_sequence(q, kc, vc, plan, D ** -0.5),
                           paged_attention_per_sequence(q, kc, vc, masked, D ** -0.5))


# -- GPU at real sizes, bf16 ----------------------------------------------------------------------

@pytest.mark.parametrize("G,block_size", [(1, 16), (4, 16), (8, 64), (3, 16)])
def test_rows_are_bit_invariant_at_real_sizes(G, block_size, gpu, gen):
    target, rows = _invariance(G, block_size, torch.bfloat16, "cuda", gen, length=GPU_LENGTH,
                               other_len=GPU_LENGTH, scenarios=6, max_others=12, H_kv=8 if G < 8 else 4, D=128)
    assert _rel_err(rows, _reference_rows(target, block_size, "cuda")) < 1e-2
