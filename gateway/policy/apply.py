"""The policy between routing and canonicalization: pin the model, de-randomize the
sampling parameters by the upstream's profile, and pick the strategy a miss runs.

Pure: the same (route, body, upstream, rules, hints) always gives the same Policy, which
is what lets prepare.PreparedMemo remember it. The per-request headers that steer it
(x-detgate-mode, -vote, -schema) are `Hints` and part of that memo's key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from gateway.config import UpstreamConfig
from gateway.errors import ApiError
from gateway.policy.rules import MAX_VOTE, ModelRule, Rules
from gateway.policy.profiles import Profile, RandomnessError, changed_params, derandomize, parse_mode, resolve_model, split_n
from gateway.strategies.schema_check import requested_schema, schema_problem
from gateway.strategies.spec import SINGLE, StrategySpec, spec_name

_SAMPLING_ROUTES = ("chat.completions", "completions")


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


def apply_policy(route: str, body: dict, upstream: UpstreamConfig, rules: Rules, hints: Hints = NO_HINTS) -> Policy:
    """Raises ApiError (400) for a request the policy refuses, naming the parameter."""
    requested = body["model"]
    pinned, aliased = resolve_model(requested, rules.aliases)
    warnings = [f"model {requested} pinned to {pinned}"] if aliased else []
    body = {**body, "model": pinned}
    mode = _mode(hints.mode, upstream.mode)
    profile = rules.profiles[upstream.profile]
    rewrites = changed_params(route, body, profile, mode)
    try:
        body, changes = derandomize(route, body, profile, mode)
    except RandomnessError as exc:
        raise ApiError(400, str(exc), param=exc.param, code="nondeterministic_parameter") from None
    warnings += changes
    spec = _strategy(route, body, profile, rules, hints, rules.model_rule(requested, pinned), warnings)
    bodies = [body]
    if mode != "off" and profile.n_policy == "split":
        bodies = split_n(body)
        if len(bodies) > 1:
            first = bodies[0]["seed"]
            warnings.append(f"n={len(bodies)} answered as {len(bodies)} requests with seeds "
                            f"{first}..{first + len(bodies) - 1}, each cached on its own")
            rewrites.append("n")
    return Policy(tuple(bodies), pinned, spec, tuple(warnings), tuple(rewrites))


def _mode(header: str | None, default: str) -> str:
    if header is None:
        return default
    try:
        return parse_mode(header)
    except ValueError as exc:
        raise ApiError(400, f"x-detgate-mode: {exc}.", param="x-detgate-mode", code="invalid_header") from None


def _vote(header: str) -> int:
    try:
        k = int(header.strip())
    except ValueError:
        k = 0
    if not 1 <= k <= MAX_VOTE:
        raise ApiError(400, f"x-detgate-vote must be a whole number from 1 to {MAX_VOTE}, not {header!r}.",
                       param="x-detgate-vote", code="invalid_header")
    return k


def _strategy(route: str, body: dict, profile: Profile, rules: Rules, hints: Hints, rule: ModelRule | None,
              warnings: list[str]) -> StrategySpec:
    if route not in _SAMPLING_ROUTES:
        for name, value in (("x-detgate-vote", hints.vote), ("x-detgate-schema", hints.schema)):
            if value is not None:
                raise ApiError(400, f"{name} applies to chat and text completions, not {route}.", param=name,
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
    schema, check, label = None, False, ""
    if route == "chat.completions":
        schema = _schema(body, rules, name)
        check = schema is not None or _check_tools(body)
        label = f"{name}:{rules.schema_digests[name]}" if name is not None else ""
    elif hints.schema is not None:
        raise ApiError(400, "x-detgate-schema applies to chat completions, whose answers are messages.",
                       param="x-detgate-schema", code="invalid_header")
    attempts = ((configured.attempts if configured else None) or rules.attempts) if check else 1
    feedback = rules.feedback and check
    name_in_key = spec_name(k, extractor_digest, check, attempts, feedback, label)
    if name_in_key == "single":
        return SINGLE
    return StrategySpec(k, extractor, check, schema, attempts, feedback, name_in_key)


def _schema(body: dict, rules: Rules, name: str | None) -> dict | None:
    """The schema answers must match; a named one comes from config and was checked there,
    one in the request is checked here, before any upstream call."""
    try:
        schema = requested_schema(body, rules.schemas, name)
    except KeyError as exc:
        raise ApiError(400, f"x-detgate-schema: {exc.args[0]}.", param="x-detgate-schema", code="unknown_schema") from None
    if name is None and schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            raise ApiError(400, f"response_format.json_schema.schema is not a valid JSON schema: {problem}.",
                           param="response_format.json_schema.schema", code="invalid_schema")
    return schema


def _check_tools(body: dict) -> bool:
    """Whether the request offers function tools (whose calls are then validated); 400 for
    a tool whose parameters are not a valid schema."""
    tools = body.get("tools")
    offered = False
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict):
            continue
        offered = True
        parameters = function.get("parameters")
        problem = schema_problem(parameters) if parameters is not None else None
        if problem is not None:
            raise ApiError(400, f"tools[{i}].function.parameters is not a valid JSON schema: {problem}.",
                           param=f"tools[{i}].function.parameters", code="invalid_schema")
    return offered
