"""One answer worth keeping: an upstream call, and when the spec checks schemas, retries
with fresh seeds until an answer validates or the attempts run out.

Attempt j of the answer that starts at seed s uses seed s + j*step: a vote of k gives its
voters seeds s..s+k-1 and step k, so no two calls of one miss share a seed. Answers are
always fetched whole (a stream cannot be checked before it has been sent): a streaming
client gets the chosen answer through its entry's synthesized stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import UpstreamError, error_body
from gateway.strategies.schema_check import SchemaError, check_content, check_tool_calls, feedback_messages, summary
from gateway.strategies.single import Call
from gateway.strategies.spec import StrategySpec
from gateway.upstream.client import UpstreamClient


@dataclass(frozen=True)
class Answer:
    seed: int  # the seed of the call that produced it
    payload: bytes  # the upstream's response, as sent
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
        message = f"no valid answer in {attempts} attempt(s); the last one failed: {summary(rejected.errors)}"
        super().__init__(502, error_body(message, type="upstream_error", param=rejected.errors[0].path if rejected.errors else None,
                                         code="schema_validation_failed"),
                         headers={"x-detgate-attempts": str(attempts)})


def whole(body: dict) -> dict:
    """The request fetched unstreamed."""
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


def problems(response: dict[str, Any], request: dict[str, Any], spec: StrategySpec) -> list[SchemaError]:
    """Every schema failure of every choice: tool calls against the offered tools, else
    the content against the spec's schema. A response without choices fails."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return [SchemaError("$", "", "the response has no choices")]
    errors: list[SchemaError] = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            errors.append(SchemaError("$", "", "a choice without a message"))
            continue
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                errors.append(SchemaError("tool_calls", "", "tool_calls is not a list"))
            else:
                errors += check_tool_calls(calls, request.get("tools") or [])
        elif spec.schema is not None:
            errors += check_content(message.get("content"), spec.schema)
    return errors


async def answer(call: Call, client: UpstreamClient, seed: int, step: int) -> Answer | Rejected:
    """Raises UpstreamError when the upstream fails: a failure is passed on, not retried here."""
    spec = call.spec
    body = whole(call.body)
    model = str(body.get("model", ""))
    tries = spec.attempts if spec.check else 1
    errors: list[SchemaError] = []
    sent = body
    for attempt in range(tries):
        current = seed + attempt * step
        sent = {**sent, "seed": current}
        payload = await client.post_json(call.upstream, call.route, sent, call.authorization)
        response = orjson.loads(payload)
        if not spec.check:
            return Answer(current, payload, response, 1)
        errors = problems(response, body, spec)
        client.metrics.schema_attempts.labels(model, "invalid" if errors else "valid").inc()
        if not errors:
            return Answer(current, payload, response, attempt + 1)
        if spec.feedback and isinstance(body.get("messages"), list):
            # Only the latest failure is shown: the prompt stays the size of one correction.
            sent = {**sent, "messages": [*body["messages"], *feedback_messages(_first_message(response), errors)]}
    return Rejected(seed, tuple(errors), tries)


def _first_message(response: dict[str, Any]) -> dict[str, Any]:
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = first.get("message")
    return message if isinstance(message, dict) else {}
