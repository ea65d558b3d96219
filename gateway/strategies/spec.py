"""What the policy decided a miss should run: a plain call, a majority vote, schema-
validated retries, or a vote among validated answers.

`name` is what the cache key says about it. Everything that can change which answer gets
stored is in it (k, the extractor, attempts, feedback, a named schema's digest), so a
vote of 3 never serves a cached vote of 5, nor an unchecked answer a checked request.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.strategies.vote import Extractor


@dataclass(frozen=True)
class StrategySpec:
    vote: int = 1
    extractor: Extractor | None = None
    check: bool = False  # answers are validated: content against `schema`, tool calls against their tools
    schema: dict[str, Any] | None = None  # what message content must match; None: content is free
    attempts: int = 1  # calls per answer when checking
    feedback: bool = False  # a retry shows the model its failed answer and the errors
    name: str = "single"
    # Asked for by a header or the model's configured strategy (a vote, a named schema,
    # attempts), not implied by the request's own tools or response format: only then may a
    # stream wait for whole answers (docs/streaming.md). Not in `name`: streams and whole
    # answers to one request share its entry.
    asked: bool = False


SINGLE = StrategySpec()


def spec_name(vote: int, extractor_digest: str, check: bool, attempts: int, feedback: bool,
              schema_label: str) -> str:
    """"single", "vote:3", "vote:3@<extractor>", "schema:3", "schema:3:feedback@<name>:<digest>",
    or a vote and a schema joined by "+"."""
    parts = []
    if vote > 1:
        parts.append(f"vote:{vote}" + (f"@{extractor_digest}" if extractor_digest else ""))
    if check:
        parts.append(f"schema:{attempts}" + (":feedback" if feedback else "") + (f"@{schema_label}" if schema_label else ""))
    return "+".join(parts) or "single"
