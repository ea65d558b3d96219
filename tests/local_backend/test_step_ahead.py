"""The engine queues step k+1 before it reads step k's tokens (llm_engine.py): what it serves
must equal reading every step before queuing the next. Batches of several sequences on the
CPU, as the preemption test does; the same batches in both runs, so the same bits."""
from __future__ import annotations

import random

import torch

import kernels
from conftest import make_engine
from local_backend.engine.sequence import PENDING
from local_backend.sampling_params import SamplingParams

PROMPTS = [[random.Random(i).randrange(1, 300) for _ in range(20 + 7 * i)] for i in range(4)]


def engine_with_events(checkpoints, **config):
    engine = make_engine(checkpoints["qwen3"], **config)
    engine.max_batch = engine.scheduler.max_batch = 4
    events: dict[int, list] = {}

    def deliver(lot):
        for request_id, event in lot.events:
            events.setdefault(request_id, []).append(event)
        engine.outbox.was_read()

    engine.outbox.connect(deliver)
    return engine, events


def serve(engine, params, ahead: bool, between=lambda step: None) -> None:
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        engine._command(("add", i, prompt, p))
    step = 0
    while engine.scheduler.has_work() or engine._in_flight:
        if ahead:
            engine._step()
        else:
            engine._collect(engine._launch(engine.scheduler.schedule()))
        step += 1
        between(step)
    engine.outbox.send()


def tokens(events) -> list[int]:
    return [e.sample.token for e in events if e.sample]


def test_ahead_serves_what_reading_each_step_first_serves(checkpoints):
    params = [SamplingParams(seed=i, max_tokens=3 + 2 * i, temperature=0.8 * (i % 2), ignore_eos=True, logprobs=2)
              for i in range(4)]
    engine, ahead = engine_with_events(checkpoints)
    order = []
    launch, finish = engine.runner.launch, engine.runner.finish
    engine.runner.launch = lambda *a: order.append("launch") or launch(*a)
    engine.runner.finish = lambda *a: order.append("finish") or finish(*a)
    serve(engine, params, ahead=True)
    assert "launch,launch" in ",".join(order)   # a step was queued while the one before was unread
    reference, each_first = engine_with_events(checkpoints)
    serve(reference, params, ahead=False)
    assert ahead == each_first
    assert [len(tokens(ahead[i])) for i in range(4)] == [3, 5, 7, 9]
    assert [ahead[i][-1].finish_reason for i in range(4)] == ["length"] * 4
    assert engine.blocks.num_used == 0 and not engine.scheduler.has_work()


def test_standard_mode_runs_a_step_ahead_too(checkpoints):
    # Its torch sampler is told on the host whether a row filters, so its launch does not wait
    # for the GPU either. It draws from torch's global generator: seeded alike, both runs draw alike.
    params = [SamplingParams(seed=i, max_tokens=4 + i, temperature=0.8 * (i % 2), top_k=3 * (i // 2), ignore_eos=True)
              for i in range(4)]
    with kernels.mode("standard"):
        engine, ahead = engine_with_events(checkpoints, mode="standard")
        order = []
        launch = engine.runner.launch
        engine.runner.launch = lambda *a: order.append("launch") or launch(*a)
        engine.runner.finish = lambda *a, finish=engine.runner.finish: order.append("finish") or finish(*a)
        torch.manual_seed(0)
        serve(engine, params, ahead=True)
        reference, each_first = engine_with_events(checkpoints, mode="standard")
        torch.manual_seed(0)
        serve(reference, params, ahead=False)
    assert "launch,launch" in ",".join(order)
    assert ahead == each_first
    assert [len(tokens(ahead[i])) for i in range(4)] == [4, 5, 6, 7]


def test_a_sequence_ended_by_end_of_sequence_drops_the_token_computed_after_it(checkpoints):
    params = [SamplingParams(seed=i, max_tokens=12, temperature=0.0) for i in range(4)]
    probe, probed = engine_with_events(checkpoints)
    probe.eos_token_ids = frozenset()
    serve(probe, params, ahead=True)
    eos = tokens(probed[1])[2]   # the third token of request 1 stands in for end-of-sequence
    engine, events = engine_with_events(checkpoints)
    engine.eos_token_ids = frozenset({eos})
    seqs = {}
    engine.scheduler.add = lambda seq, add=engine.scheduler.add: seqs.setdefault(seq.request_id, seq) and add(seq)
    serve(engine, params, ahead=True)
    got = tokens(events[1])
    assert got[-1] == eos and eos not in got[:-1] and len(got) <= 3
    assert events[1][-1].finish_reason == "stop" and all(e.finish_reason is None for e in events[1][:-1])
    assert seqs[1].token_ids[seqs[1].num_prompt_tokens:] == got   # no PENDING left behind
    assert engine.blocks.num_used == 0


def test_an_abort_while_a_step_is_in_flight_ends_the_request_there(checkpoints):
    params = [SamplingParams(seed=i, max_tokens=10, temperature=0.0, ignore_eos=True) for i in range(4)]
    engine, events = engine_with_events(checkpoints)
    seqs = {}
    engine.scheduler.add = lambda seq, add=engine.scheduler.add: seqs.setdefault(seq.request_id, seq) and add(seq)
    served_at_abort = []

    def abort_two(step):
        if step == 4:
            assert engine._in_flight is not None
            held = [e for r, e in engine.outbox.lot.events if r == 2]   # read, not yet handed over
            served_at_abort.append(len(tokens(events.get(2, []) + held)))
            engine._command(("abort", 2))

    serve(engine, params, ahead=True, between=abort_two)
    assert PENDING not in seqs[2].token_ids
    # The tokens read before the abort reach the client; the one in flight does not.
    assert len(tokens(events[2])) == served_at_abort[0] < 10
    assert [len(tokens(events[i])) for i in (0, 1, 3)] == [10, 10, 10]
    assert engine.blocks.num_used == 0
