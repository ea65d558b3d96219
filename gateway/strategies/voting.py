"""The strategy for every spec but SINGLE: a majority vote of k over answers that are
schema-checked when the spec says so (k = 1 is schema-validated retries alone).

Calls go out in waves. Each wave launches just enough new voters that the current leader
could reach a majority (k=3: two at first, a third only when they disagree), all of one
wave at once. Deciding only on whole waves makes the counted answers a function of the
answers alone, never of which call returned first, so the same answers elect the same
winner whatever the network did; and no call is made that could not change the outcome.

A failed call cancels the rest of its wave and fails the vote: the upstream's error is
passed on and nothing is cached. A voter whose attempts all fail their schema casts no
ballot, so the vote runs among valid answers only; it fails (502) only when no voter
found one. The winner is stored as one entry, its vote record and attempts beside it.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Awaitable

from gateway.cache.entry import Entry
from gateway.cache.feed import Feed
from gateway.ops import tracing
from gateway.strategies.retries import Answer, Rejected, SchemaExhausted, answer
from gateway.strategies.single import Call
from gateway.strategies.vote import Ballot, Vote, ballot, decide
from gateway.upstream.client import UpstreamClient


async def choose(call: Call, client: UpstreamClient, feed: Feed) -> Entry:
    """Nothing is pushed to `feed`: no answer is final until the vote is."""
    spec = call.spec
    k = spec.vote
    base = call.seed
    model = str(call.body.get("model", ""))
    answers: dict[int, Answer] = {}  # by the seed that produced it
    rejected: list[Rejected] = []
    ballots: list[Ballot] = []
    launched = 0
    outcome: Vote | None = None
    while len(rejected) < k:
        counted = k - len(rejected)  # a vote among valid answers: the rejected do not count
        outcome = decide(ballots, counted) if ballots else None
        if outcome is not None:
            break
        lead = max(Counter(b.group for b in ballots).values(), default=0)
        need = min(counted // 2 + 1 - lead, k - launched)
        results = await _wave([tracing.member(answer(call, client, base + i, k), base + i, spec.vote)
                               for i in range(launched, launched + need)])
        launched += need
        for result in results:
            if isinstance(result, Answer):
                answers[result.seed] = result
                ballots.append(ballot(result.seed, call.surface.answer_text(result.response), spec.extractor))
            else:
                rejected.append(result)
    metrics = client.metrics
    attempts = sum(a.attempts for a in answers.values()) + sum(r.attempts for r in rejected)
    if outcome is None:
        metrics.schema_attempts.labels(model, "exhausted").inc()
        if k > 1:
            metrics.votes.labels(model, "failed").inc()
        raise SchemaExhausted(min(rejected, key=lambda r: r.seed), attempts)
    meta: dict = {}
    if spec.check:
        meta["attempts"] = attempts
    if k > 1:
        vote = dataclasses.replace(outcome, k=k)  # reported against the k asked for, rejected voters included
        meta["vote"] = vote.record()
        metrics.votes.labels(model, _outcome(vote)).inc()
        metrics.vote_agreement.observe(vote.votes / vote.cast)
    return dataclasses.replace(answers[outcome.winner.seed].entry, meta=meta)


def _outcome(vote: Vote) -> str:
    if vote.tie_break:
        return "tie_break"
    return "majority" if vote.votes > vote.k // 2 else "plurality"


async def _wave(calls: list[Awaitable[Answer | Rejected]]) -> list[Answer | Rejected]:
    """All results in launch order; the first failure (by launch order) cancels the rest
    and is raised."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    failures = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    if failures:
        raise failures[0]
    return [t.result() for t in tasks]


def meta_headers(meta: dict) -> dict[str, str]:
    """The x-detgate-* headers an entry's meta stands for, on the miss and on every hit."""
    headers = {}
    vote = meta.get("vote")
    if isinstance(vote, dict) and "votes" in vote:
        headers["x-detgate-votes"] = str(vote["votes"])
    if "attempts" in meta:
        headers["x-detgate-attempts"] = str(meta["attempts"])
    return headers
