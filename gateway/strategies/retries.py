"""One answer worth keeping: an upstream call, and when the spec checks schemas, retries
with fresh seeds until an answer validates or the attempts run out.

Attempt j of the answer that starts at seed s uses seed s + j*step: a vote of k gives its
voters seeds s..s+k-1 and step k, so no two calls of one miss share a seed. Answers are
fetched whole (a stream cannot be checked before it has been sent): a streaming client
gets here only when it asked for a vote or a named schema, and then gets the chosen
answer through its entry's synthesized stream (docs/streaming.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.cache.entry import Entry
from gateway.errors import UpstreamError
from gateway.ops import tracing
from gateway.strategies.schema_check import SchemaError, summary
from gateway.strategies.single import Call
from gateway.upstream.client import UpstreamClient


@dataclass(frozen=True)
class Answer:
    seed: int  # the seed of the call that produced it
    entry: Entry  # the upstream's response, as its surface stores it
    response: dict[str, Any]
    attempts: int


@dataclass(frozen=True)
class Rejected:
    seed: int  # the first seed tried
    errors: tuple[SchemaError, ...]  # of the last attempt
    attempts: int


class SchemaExhausted(UpstreamError):
    """Every attempt answered, none matched the schema: the request was fine and the
    upstream's answers were not, hence 502 (as for any unusable upstream answer), never
    cached, and worth retrying."""

    def __init__(self, rejected: Rejected, attempts: int):
        super().__init__(502, headers={"x-detgate-attempts": str(attempts)},
                         message=f"no valid answer in {attempts} attempt(s); the last one failed: {summary(rejected.errors)}",
                         code="schema_validation_failed", param=rejected.errors[0].path if rejected.errors else None)


async def answer(call: Call, client: UpstreamClient, seed: int, step: int) -> Answer | Rejected:
    """Raises UpstreamError when the upstream fails: a failure is passed on, not retried here.
    Where no seed is sent (the wire or the model takes none) every attempt sends the same
    request, and the upstream's own variation is what a retry hopes for."""
    spec, surface = call.spec, call.surface
    body = surface.upstream_body(call.body, False)
    model = str(body.get("model", ""))
    tries = spec.attempts if spec.check else 1
    seeded = "seed" in body  # not where the wire or the model takes no seed: the policy left it out
    errors: list[SchemaError] = []
    sent = body
    for attempt in range(tries):
        current = seed + attempt * step
        if seeded:
            sent = {**sent, "seed": current}
        payload = await tracing.schema_attempt(client.post_json(call.upstream, surface.path, sent, call.headers),
                                               attempt, spec.check)
        entry = surface.from_body(call.upstream.name, payload)  # raises for a 200 that holds no answer
        response = orjson.loads(payload)
        if not spec.check:
            return Answer(current, entry, response, 1)
        errors = surface.problems(response, body, spec.schema)
        client.metrics.schema_attempts.labels(model, "invalid" if errors else "valid").inc()
        if not errors:
            return Answer(current, entry, response, attempt + 1)
        if spec.feedback:
            # Only the latest failure is shown: the prompt stays the size of one correction.
            sent = surface.with_feedback(body, response, errors) or sent
    return Rejected(seed, tuple(errors), tries)
