"""The policy between routing and canonicalization: pin the model by the upstream's
profile, de-randomize the sampling parameters by that profile within what the model
accepts (capabilities.py), and pick the strategy a miss runs; `text_rules` reads whether
canonicalization applies its text rules.

Pure: the same (surface, body, upstream, rules, hints) always gives the same Policy, which
is what lets prepare.PreparedMemo remember it. The per-request headers that steer it
(x-detgate-mode, -vote, -schema) are `Hints` and part of that memo's key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from gateway.apis.surface import Surface
from gateway.config import UpstreamConfig
from gateway.errors import ApiError
from gateway.policy.canonical import TEXT_SETTINGS
from gateway.policy.profiles import (
    Profile,
    RandomnessError,
    changed_params,
    derandomize,
    parse_mode,
    resolve_model,
    split_n,
    unsent,
)
from gateway.policy.rules import MAX_VOTE, ModelRule, Rules
from gateway.strategies.schema_check import named_schema, schema_problem
from gateway.strategies.spec import SINGLE, StrategySpec, spec_name


class Hints(NamedTuple):
    """The x-detgate-mode, x-detgate-vote and x-detgate-schema headers, as sent. A tuple:
    built and hashed for the prepared-request memo on every hit."""

    mode: str | None = None
    vote: str | None = None
    schema: str | None = None


NO_HINTS = Hints()


@dataclass(frozen=True)
class Policy:
    bodies: tuple[dict, ...]  # one per answer to fetch: several when the profile splits n > 1
    model: str  # the pinned model version
    spec: StrategySpec
    warnings: tuple[str, ...]  # for x-detgate-warnings
    rewrites: tuple[str, ...]  # the parameters changed, for detgate_param_rewrites_total
    # Parameters each body carries for the key but the upstream is never sent: a seed the
    # wire or the model does not take.
    unsent: frozenset[str] = frozenset()


def apply_policy(surface: Surface, body: dict, upstream: UpstreamConfig, rules: Rules, hints: Hints = NO_HINTS) -> Policy:
    """Raises ApiError (400) for a request the policy refuses, naming the parameter."""
    requested = body["model"]
    profile = rules.profiles[upstream.profile]
    pinned, aliased = resolve_model(requested, profile.aliases)
    warnings = [f"model {requested} pinned to {pinned}"] if aliased else []
    body = {**body, "model": pinned}
    mode = _mode(hints.mode, upstream.mode)
    capability = rules.capabilities.of(pinned, requested)
    refused = surface.refuses(body)
    if refused:
        capability = dataclasses.replace(capability, accepts=capability.accepts - refused)
    rewrites = changed_params(surface.sampling, body, profile, mode, capability)
    try:
        body, changes = derandomize(surface.sampling, body, profile, mode, capability)
    except RandomnessError as exc:
        raise ApiError(400, str(exc), param=exc.param, code=exc.code) from None
    warnings += changes
    if mode != "off" and surface.sampling and "seed" not in surface.sampling:
        warnings.append(f"no seed: {surface.name} has none, so a miss is the provider's own draw, "
                        "and the cache replays it")
    spec = _strategy(surface, body, profile, rules, hints, rules.model_rule(requested, pinned), warnings)
    bodies = [body]
    if mode != "off" and profile.n_policy == "split" and "n" in surface.sampling:
        bodies = split_n(body)
        if len(bodies) > 1:
            first = bodies[0]["seed"]
            warnings.append(f"n={len(bodies)} answered as {len(bodies)} requests with seeds "
                            f"{first}..{first + len(bodies) - 1}, each cached on its own")
            rewrites.append("n")
    return Policy(tuple(bodies), pinned, spec, tuple(warnings), tuple(rewrites),
                  unsent(surface.sampling, capability, mode))


def _mode(header: str | None, default: str) -> str:
    if header is None:
        return default
    try:
        return parse_mode(header)
    except ValueError as exc:
        raise ApiError(400, f"x-detgate-mode: {exc}.", param="x-detgate-mode", code="invalid_header") from None


def text_rules(header: str | None, upstream: UpstreamConfig) -> bool:
    """Whether canonicalization applies its text rules: x-detgate-canonical, else the
    upstream's `canonical` setting. 400 for a header that names neither setting."""
    if header is None:
        return upstream.canonical == "text"
    setting = header.strip().lower()
    if setting not in TEXT_SETTINGS:
        raise ApiError(400, f"x-detgate-canonical must be one of {', '.join(TEXT_SETTINGS)}, not {header!r}.",
                       param="x-detgate-canonical", code="invalid_header")
    return setting == "text"


def _vote(header: str) -> int:
    try:
        k = int(header.strip())
    except ValueError:
        k = 0
    if not 1 <= k <= MAX_VOTE:
        raise ApiError(400, f"x-detgate-vote must be a whole number from 1 to {MAX_VOTE}, not {header!r}.",
                       param="x-detgate-vote", code="invalid_header")
    return k


def _strategy(surface: Surface, body: dict, profile: Profile, rules: Rules, hints: Hints, rule: ModelRule | None,
              warnings: list[str]) -> StrategySpec:
    if not surface.sampling:
        for name, value in (("x-detgate-vote", hints.vote), ("x-detgate-schema", hints.schema)):
            if value is not None:
                raise ApiError(400, f"{name} applies to answers that are sampled, not to {surface.name}.", param=name,
                               code="invalid_header")
        return SINGLE
    configured = rule.strategy if rule is not None else None
    k = _vote(hints.vote) if hints.vote is not None else (configured.vote if configured else 1)
    if k > 1 and not profile.votes:
        warnings.append(f"vote of {k} not run: the {profile.name} profile replays one seeded answer exactly")
        k = 1
    extractor = rule.extractor if rule is not None and k > 1 else None
    extractor_digest = rule.extractor_digest if extractor is not None else ""

    name = hints.schema if hints.schema is not None else (configured.schema_name if configured else None)
    if not surface.checks_schemas:
        if hints.schema is not None:
            raise ApiError(400, f"x-detgate-schema applies to answers that are messages, not to {surface.name}.",
                           param="x-detgate-schema", code="invalid_header")
        name = None
    schema = _schema(surface, body, rules, name)
    offers_tools = _check_tools(surface, body)  # before `or`: a bad tool schema is a 400 beside a response schema too
    check = schema is not None or offers_tools
    if check and name is None and profile.decodes_strict_schemas and decoder_bound(surface, body):
        check, schema = False, None
        warnings.append(f"no schema check: the {profile.name} upstream decodes under this request's strict schemas")
    label = f"{name}:{rules.schema_digests[name]}" if name is not None else ""
    attempts = ((configured.attempts if configured else None) or rules.attempts) if check else 1
    feedback = rules.feedback and check
    name_in_key = spec_name(k, extractor_digest, check, attempts, feedback, label)
    if name_in_key == "single":
        return SINGLE
    asked = k > 1 or name is not None or (check and configured is not None and configured.attempts is not None)
    return StrategySpec(k, extractor, check, schema, attempts, feedback, name_in_key, asked)


def decoder_bound(surface: Surface, body: dict) -> bool:
    """Whether an upstream that decodes under strict schemas holds every answer to this request
    to its schemas: a chat request whose response_format is a strict json_schema (or
    json_object), and whose tools, if any, are each strict or must be called."""
    if surface.name != "chat.completions":
        return False
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        if not (isinstance(spec, dict) and spec.get("strict") is True):
            return False
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        return False
    choice = body.get("tool_choice")
    forced = choice == "required" or isinstance(choice, dict)
    return forced or all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                         and t["function"].get("strict") is True for t in tools)


def _schema(surface: Surface, body: dict, rules: Rules, name: str | None) -> dict | None:
    """The schema answers must match; a named one comes from config and was checked there,
    one in the request is checked here, before any upstream call."""
    if name is not None:
        try:
            return named_schema(rules.schemas, name)
        except KeyError as exc:
            raise ApiError(400, f"x-detgate-schema: {exc.args[0]}.", param="x-detgate-schema",
                           code="unknown_schema") from None
    requested = surface.requested_schema(body)
    if requested is None:
        return None
    param, schema = requested
    problem = schema_problem(schema)
    if problem is not None:
        raise ApiError(400, f"{param} is not a valid JSON schema: {problem}.", param=param, code="invalid_schema")
    return schema


def _check_tools(surface: Surface, body: dict) -> bool:
    """Whether the request offers function tools (whose calls are then validated); 400 for
    a tool whose parameters are not a valid schema."""
    offered = False
    for param, parameters in surface.tool_schemas(body):
        offered = True
        problem = schema_problem(parameters) if parameters is not None else None
        if problem is not None:
            raise ApiError(400, f"{param} is not a valid JSON schema: {problem}.", param=param, code="invalid_schema")
    return offered
