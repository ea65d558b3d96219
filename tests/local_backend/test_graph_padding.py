"""The padding a CUDA graph replays with leaves the real rows alone. On the GPU the graphs run
with padded inputs (decode: one-token sequences that write no KV; prefill: extra sequences of a
chunk at most, then empty slots); here the same padded inputs go through the eager forward and
the real tokens' hidden states are compared with an unpadded forward (to fp32 rounding: the CPU
reference kernels are not batch-invariant)."""
from __future__ import annotations

import torch

from conftest import make_engine
from local_backend.engine.scheduler import Scheduled
from local_backend.engine.sequence import Sequence
from local_backend.sampling_params import SamplingParams


def batch(engine, lengths, decoding):
    seqs = []
    for i, n in enumerate(lengths):
        seq = Sequence(i, [(7 * i + j) % 300 + 1 for j in range(n)], n, SamplingParams(seed=i, max_tokens=4))
        assert engine.blocks.allocate(seq)
        seq.num_computed_tokens = n - 1 if decoding else 0
        seqs.append(seq)
    return [Scheduled(s, 1 if decoding else len(s)) for s in seqs]


def hidden(runner, scheduled, pad):
    staged = runner._stage(scheduled)
    seqs, tokens, max_q, max_kv = staged.seqs, staged.tokens, staged.max_q_len, staged.max_kv_len
    if pad:
        seqs, tokens, max_q, max_kv = pad(staged)
    runner.inputs.upload(seqs)
    with torch.inference_mode():
        runner._forward(seqs, tokens, max_q, max_kv)
    return runner.hidden[:staged.tokens].clone()


def test_prefill_padding_is_extra_sequences_and_empty_slots(checkpoints):
    engine = make_engine(checkpoints["qwen3"], chunk_size=32, max_batched_tokens=128, max_batch=4)
    runner = engine.runner
    scheduled = batch(engine, [20, 7, 30], decoding=False)

    def pad(staged):
        size = 128   # 71 padding tokens: sequences of 32, 32 and 7, then empty slots
        runner._pad_prefill(staged.seqs, staged.tokens, size)
        return runner.max_seqs, size, runner.chunk_size, runner.max_model_len

    plain = hidden(runner, scheduled, None)
    padded = hidden(runner, scheduled, pad)
    assert runner.inputs.host["kv_lens"][3:6].tolist() == [32, 32, 7]
    assert torch.allclose(padded, plain, atol=1e-5)


def test_decode_padding_rows_write_no_kv(checkpoints):
    engine = make_engine(checkpoints["qwen3"], max_batch=8)
    runner = engine.runner
    scheduled = batch(engine, [20, 9, 33], decoding=True)
    before = [k.clone() for k, _ in runner.kv_caches]

    def pad(staged):
        runner._pad(staged.seqs, 8, staged.tokens, 8)
        return 8, 8, 1, staged.max_kv_len

    padded = hidden(runner, scheduled, pad)
    written = sum(int((k != b).any(dim=(1, 2, 3)).sum()) for (k, _), b in zip(runner.kv_caches, before))
    assert written == 3 * len(before)   # one block per real sequence and layer, none for the padding rows
    plain = hidden(runner, scheduled, None)
    assert torch.allclose(padded, plain, atol=1e-5)
