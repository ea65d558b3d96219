"""The determinism rules from config, compiled once at startup: provider profiles (with
their model aliases), model capabilities, per-model strategies (vote, extractor, schema,
attempts) and named schemas.

Compiling checks everything a request would otherwise trip over later (an unknown
profile, a regex that does not compile, a schema that is not a schema), so bad config
stops `detgate serve` instead of failing requests one by one.

In TOML:

    aliases = { "gpt-4o" = "gpt-4o-2024-11-20", "gpt-4" = false }   # the openai profile's; false un-pins
    schema_attempts = 3
    schema_feedback = true
    [[profiles]]
    name = "groq"
    zero_temperature = 1e-8
    [[profiles]]
    name = "azure"
    aliases = { "gpt-4o" = "my-gpt-4o-deployment" }
    [capabilities."my-o3*"]
    accepts = ["seed"]
    honours_seed = false
    [strategies."gpt-4o*"]
    vote = 3
    extractor = { regex = "Answer: (.*)" }
    [schemas.invoice]
    type = "object"
    required = ["total"]
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Iterable, Mapping

import xxhash
from pydantic import BaseModel, ConfigDict, Field

from gateway.policy.canonical import value_json
from gateway.policy.capabilities import Capabilities, CapabilitySpec, table
from gateway.policy.profiles import PROFILES, Profile, amended, profile_from_dict
from gateway.strategies.schema_check import schema_problem
from gateway.strategies.vote import Extractor, extractor_from_dict

# A vote of k makes up to k upstream calls per miss, each retried up to the attempts:
# bounded so that one request header cannot order hundreds of paid calls.
MAX_VOTE = 9
MAX_ATTEMPTS = 10


class ModelStrategy(BaseModel):
    """How misses for the models matching one glob are answered."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    vote: int = Field(1, ge=1, le=MAX_VOTE)
    extractor: dict[str, str] | None = None
    schema_name: str | None = Field(None, alias="schema")  # a named schema every answer must match
    attempts: int | None = Field(None, ge=1, le=MAX_ATTEMPTS)  # default: Settings.schema_attempts


@dataclass(frozen=True)
class ModelRule:
    glob: str
    strategy: ModelStrategy
    extractor: Extractor | None
    extractor_digest: str  # what the key says about the extractor: it decides which answer wins


@dataclass(frozen=True)
class Rules:
    profiles: Mapping[str, Profile]
    capabilities: Capabilities
    models: tuple[ModelRule, ...]
    schemas: Mapping[str, dict]
    schema_digests: Mapping[str, str]  # named schema -> digest, for the key: config may change a schema
    attempts: int
    feedback: bool

    def model_rule(self, *names: str) -> ModelRule | None:
        """The first configured rule whose glob matches any of `names` (the name the client
        sent and the pinned version)."""
        for rule in self.models:
            if any(fnmatchcase(name, rule.glob) for name in names):
                return rule
        return None


def digest(value: Any) -> str:
    return xxhash.xxh3_64_hexdigest(value_json(value))


def compile_rules(*, profiles: Iterable[Mapping[str, Any]], aliases: Mapping[str, str | bool | None],
                  capabilities: Mapping[str, CapabilitySpec], strategies: Mapping[str, ModelStrategy],
                  schemas: Mapping[str, dict], attempts: int, feedback: bool,
                  upstream_profiles: Iterable[tuple[str, str]]) -> Rules:
    """Raises ValueError naming what is wrong. Top-level `aliases` amend the openai
    profile's table, before user profiles are built on it."""
    known = dict(PROFILES)
    openai = known["openai"]
    known["openai"] = dataclasses.replace(openai, aliases=amended(openai.aliases, aliases))
    for spec in profiles:
        profile = profile_from_dict(spec, known)
        if profile.name in PROFILES:
            raise ValueError(f"profile {profile.name!r} is built in; give yours another name")
        known[profile.name] = profile
    for upstream, name in upstream_profiles:
        if name not in known:
            raise ValueError(f"upstream {upstream!r}: unknown profile {name!r}; known: {sorted(known)}")
    for name, schema in schemas.items():
        problem = schema_problem(schema)
        if problem is not None:
            raise ValueError(f"schemas.{name} is not a valid JSON schema: {problem}")
    models = []
    for glob, strategy in strategies.items():
        if strategy.schema_name is not None and strategy.schema_name not in schemas:
            raise ValueError(f"strategies.{glob!r}: no schema named {strategy.schema_name!r}; known: {sorted(schemas)}")
        extractor = extractor_from_dict(strategy.extractor) if strategy.extractor is not None else None
        models.append(ModelRule(glob, strategy, extractor,
                                digest(strategy.extractor) if strategy.extractor is not None else ""))
    return Rules(known, table(capabilities.items()), tuple(models), dict(schemas),
                 {n: digest(s) for n, s in schemas.items()}, attempts, feedback)
