"""Provider profiles: how to make a request as deterministic as its upstream allows.

A profile says what a provider does with sampling parameters and which model names it
pins. `derandomize` applies it to a request body before canonicalization, so the
de-randomized parameters are what the cache key is signed over and what the upstream
receives; what the model accepts (capabilities.py) bounds what is sent.

| check                 | openai / generic-openai-compatible          | whitebox            |
|-----------------------|---------------------------------------------|---------------------|
| temperature absent    | set to the profile's default (0)            | left to the backend |
| temperature 0         | sent as the profile's `zero_temperature`    | kept                |
| temperature > 0       | kept, with a warning (the seed is best effort, or ignored) | kept |
| top_p                 | forced to 1                                 | kept                |
| top_k                 | removed                                     | kept                |
| seed absent           | fixed to the profile's `seed`               | fixed               |
| n > 1                 | a plan of n one-answer requests, or refused, by `n_policy` | same |
| a parameter the model refuses (capabilities) | never sent: removed with a warning; a seed stays in the key | same |
| model aliases         | `openai`, `anthropic`: public names pinned to dated snapshots (`OPENAI_ALIASES`, `ANTHROPIC_ALIASES`) | none |
| strict schema (chat)  | answers checked against it, retried when invalid | not checked: the backend decodes under it (`decodes_strict_schemas`) |

The whitebox backend samples from a generator keyed by (seed, step), so any temperature
and top_p replays exactly once the seed is fixed; a black-box provider only promises
"best effort" for a seed, so there everything that adds randomness is taken out.

Modes, per upstream and per request (`x-detgate-mode`):
- `enforce` rewrites and reports each change as a warning;
- `reject` rewrites nothing and raises RandomnessError naming the first parameter that
  `enforce` would have changed or warned about (a parameter the model refuses included);
- `off` passes the body through untouched.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from gateway.policy.capabilities import ANY, PARAMS, Capability
from gateway.upstream.wires import WIRES

Mode = Literal["enforce", "reject", "off"]
MODES: tuple[Mode, ...] = ("enforce", "reject", "off")
NPolicy = Literal["split", "reject"]

@dataclass(frozen=True)
class Profile:
    name: str
    # Temperature for a request that gives none; None leaves it to the upstream.
    default_temperature: float | None = 0.0
    # What to send for temperature 0. Some providers reject 0 or read it as "use your
    # default": such a profile sends a tiny positive value, which is greedy in effect.
    zero_temperature: float = 0.0
    # Take out top_p and top_k and flag temperature > 0 (black-box providers).
    fix_sampling: bool = True
    seed: int = 0
    n_policy: NPolicy = "split"
    # Whether a majority vote can add anything. Not where one seeded answer already
    # replays exactly (whitebox): there k calls would return k copies of one answer.
    votes: bool = True
    # Whether the upstream decodes under a chat request's strict schemas (grammar-constrained:
    # the bundled backend, vLLM, SGLang), so that its answers cannot break them: the gateway
    # then neither checks them nor retries (apply.py), which against a seeded whitebox
    # upstream would only fetch the same answer again.
    decodes_strict_schemas: bool = False
    # The wire format the provider speaks natively (gateway/upstream/wires.py): the cached
    # routes its upstreams serve unless they list theirs, and how they are sent credentials.
    wire: str = "openai"
    # Public model names -> the pinned version this provider serves under them. A name
    # not in the table is sent as named: only the provider knows its own snapshots.
    aliases: Mapping[str, str] = field(default_factory=dict, hash=False)


# OpenAI's public names -> the dated snapshot each pointed at when this table was written.
# A name not in the table is taken as already pinned.
OPENAI_ALIASES: dict[str, str] = {
    "gpt-3.5-turbo": "gpt-3.5-turbo-0125",
    "gpt-4": "gpt-4-0613",
    "gpt-4-turbo": "gpt-4-turbo-2024-04-09",
    "gpt-4o": "gpt-4o-2024-08-06",
    "gpt-4o-mini": "gpt-4o-mini-2024-07-18",
    "gpt-4.1": "gpt-4.1-2025-04-14",
    "gpt-4.1-mini": "gpt-4.1-mini-2025-04-14",
    "gpt-4.1-nano": "gpt-4.1-nano-2025-04-14",
    "gpt-5": "gpt-5-2025-08-07",
    "gpt-5-mini": "gpt-5-mini-2025-08-07",
    "gpt-5-nano": "gpt-5-nano-2025-08-07",
    "o1": "o1-2024-12-17",
    "o3": "o3-2025-04-16",
    "o3-mini": "o3-mini-2025-01-31",
    "o4-mini": "o4-mini-2025-04-16",
}
# Anthropic's undated names that point at a dated snapshot. From Claude 4.6 on, the name
# is the snapshot: there is nothing to pin.
ANTHROPIC_ALIASES: dict[str, str] = {
    "claude-opus-4-5": "claude-opus-4-5-20251101",
    "claude-sonnet-4-5": "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5": "claude-haiku-4-5-20251001",
}

PROFILES: dict[str, Profile] = {
    "openai": Profile("openai", aliases=OPENAI_ALIASES),
    "generic-openai-compatible": Profile("generic-openai-compatible"),
    "whitebox": Profile("whitebox", default_temperature=None, fix_sampling=False, votes=False,
                        decodes_strict_schemas=True),
    "anthropic": Profile("anthropic", wire="anthropic", aliases=ANTHROPIC_ALIASES),
}


def profile_from_dict(spec: Mapping[str, Any], known: Mapping[str, Profile] = PROFILES) -> Profile:
    """A user-defined profile from config: `name`, optionally `base` (a known profile it
    starts from, default generic-openai-compatible) and any Profile field to override;
    `aliases` amends the base's table (`false` un-pins a name).

    >>> profile_from_dict({"name": "groq", "zero_temperature": 1e-8}).zero_temperature
    1e-08
    """
    spec = dict(spec)
    name = spec.pop("name", None)
    if not isinstance(name, str) or not name:
        raise ValueError("a profile needs a non-empty string 'name'")
    base_name = spec.pop("base", "generic-openai-compatible")
    if base_name not in known:
        raise ValueError(f"profile {name!r}: unknown base {base_name!r}; known: {sorted(known)}")
    fields = {f.name for f in dataclasses.fields(Profile)} - {"name"}
    unknown = spec.keys() - fields
    if unknown:
        raise ValueError(f"profile {name!r}: unknown fields {sorted(unknown)}; known: {sorted(fields)}")
    base = known[base_name]
    if "aliases" in spec:
        spec["aliases"] = amended(base.aliases, spec["aliases"], f"profile {name!r}: aliases")
    profile = dataclasses.replace(base, name=name, **spec)
    _check(profile)
    return profile


def amended(aliases: Mapping[str, str], overrides: Any, where: str = "aliases") -> dict[str, str]:
    """`aliases` with config's `overrides` (name -> pinned version; false or null un-pins)."""
    if not isinstance(overrides, Mapping):
        raise ValueError(f"{where} must be a table of model name -> pinned version")
    table = dict(aliases)
    for name, pinned in overrides.items():
        if pinned is None or pinned is False:
            table.pop(name, None)
        elif isinstance(pinned, str) and pinned:
            table[name] = pinned
        else:
            raise ValueError(f"{where}.{name} must be a model name, or false to un-pin, not {pinned!r}")
    return table


def _check(p: Profile) -> None:
    if p.default_temperature is not None and not (_is_number(p.default_temperature)
                                                  and p.default_temperature >= 0):
        raise ValueError(f"profile {p.name!r}: default_temperature must be a number >= 0 or null")
    if not _is_number(p.zero_temperature) or not 0 <= p.zero_temperature < 0.01:
        raise ValueError(f"profile {p.name!r}: zero_temperature must be in [0, 0.01), "
                         f"a stand-in for 0, got {p.zero_temperature!r}")
    if type(p.fix_sampling) is not bool:
        raise ValueError(f"profile {p.name!r}: fix_sampling must be true or false")
    for flag in ("votes", "decodes_strict_schemas"):
        if type(getattr(p, flag)) is not bool:
            raise ValueError(f"profile {p.name!r}: {flag} must be true or false")
    if type(p.seed) is not int:
        raise ValueError(f"profile {p.name!r}: seed must be an integer")
    if p.n_policy not in ("split", "reject"):
        raise ValueError(f"profile {p.name!r}: n_policy must be 'split' or 'reject'")
    if p.wire not in WIRES:
        raise ValueError(f"profile {p.name!r}: wire must be one of {', '.join(WIRES)}")


def _is_number(x: Any) -> bool:
    return type(x) in (int, float)


def parse_mode(value: str) -> Mode:
    """A mode from config or the x-detgate-mode header; ValueError names the choices."""
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"unknown mode {value!r}; expected one of {', '.join(MODES)}")
    return mode  # type: ignore[return-value]


class RandomnessError(ValueError):
    """A request refused because `param` adds randomness (code nondeterministic_parameter)
    or because the model does not accept it (code unsupported_parameter)."""

    def __init__(self, param: str, message: str, code: str = "nondeterministic_parameter"):
        super().__init__(message)
        self.param = param
        self.code = code

    def error(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error",
                          "param": self.param, "code": self.code}}


def sent_params(sampling: frozenset[str], capability: Capability) -> frozenset[str]:
    """The sampling parameters a call may carry: those the wire has and the model accepts."""
    return sampling & capability.accepts


def unsent(sampling: frozenset[str], capability: Capability, mode: Mode) -> frozenset[str]:
    """The parameters never sent, though a de-randomized body may carry them for the key (a
    seed the wire or the model does not take). None in `off` mode, which sends the body as
    it came."""
    if mode == "off" or not sampling:
        return frozenset()
    return PARAMS - sent_params(sampling, capability)


def derandomize(sampling: frozenset[str], body: dict, profile: Profile, mode: Mode,
                capability: Capability = ANY) -> tuple[dict, list[str]]:
    """(the body to canonicalize, one warning per change made).

    `sampling` is the surface's sampling parameters (none: nothing to de-randomize) and
    `capability` what the model accepts. Never mutates `body`. Raises RandomnessError in
    `reject` mode for the first parameter that adds randomness or that the model refuses,
    and in both modes for n > 1 when the profile refuses it. A seed is chosen even where
    it is not sent (see `unsent`): the key carries it. With n > 1 under a `split` profile,
    the body keeps its n: `split_n` makes the plan. Warnings are short ASCII, fit for a
    header.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "off" or not sampling:
        return body, []
    sends = sent_params(sampling, capability)
    changes = _changes(body, profile, sends, capability)
    if mode == "reject" and changes:
        param, message, _, code = changes[0]
        raise RandomnessError(param, message, code)
    n = body.get("n")
    if type(n) is int and n > 1 and profile.n_policy == "reject":
        raise RandomnessError("n", f"n={n} is not supported by the {profile.name} profile: "
                              f"send {n} requests with distinct seeds instead")
    if mode == "reject":
        return body, []
    out = dict(body)
    if profile.fix_sampling and "top_p" in sends and out.get("top_p") is None:
        out["top_p"] = 1  # an absent top_p already means 1: made explicit, not a change
    if "seed" not in sends and out.get("seed") is None:
        out["seed"] = profile.seed  # for the key alone: what is sent does not change
    for param, _, value, _ in changes:
        if value is _DROP:
            out.pop(param, None)
        elif value is not _KEEP:
            out[param] = value
    return out, [message for _, message, _, _ in changes]


def changed_params(sampling: frozenset[str], body: dict, profile: Profile, mode: Mode,
                   capability: Capability = ANY) -> list[str]:
    """The parameters `derandomize` changes or warns about, one per warning, in its order
    (for counting rewrites by parameter)."""
    if mode == "off" or not sampling:
        return []
    return [param for param, _, _, _ in _changes(body, profile, sent_params(sampling, capability), capability)]


_KEEP = object()  # a warning only: the parameter stays as sent
_DROP = object()
_RANDOM, _REFUSED = "nondeterministic_parameter", "unsupported_parameter"


def _changes(body: dict, p: Profile, sends: frozenset[str], capability: Capability) -> list[tuple[str, str, Any, str]]:
    """(param, message, new value or _KEEP/_DROP, error code) for each parameter that adds
    randomness or that the model does not accept."""
    out = []
    model = body.get("model")
    for param in ("temperature", "top_p", "top_k"):
        if param not in sends and body.get(param) is not None:
            out.append((param, f"{param} removed: {model} does not accept it", _DROP, _REFUSED))
    if "temperature" in sends:
        out += _temperature(body.get("temperature"), p, capability, model)
    if p.fix_sampling:
        top_p = body.get("top_p")
        if "top_p" in sends and top_p is not None and top_p != 1:
            out.append(("top_p", f"top_p forced to 1 (was {top_p})", 1, _RANDOM))
        if "top_k" in sends and "top_k" in body:
            out.append(("top_k", "top_k removed", _DROP, _RANDOM))
    seed = body.get("seed")
    if "seed" not in sends:
        if seed is not None:
            out.append(("seed", f"seed {seed} kept in the key, not sent: {model} does not accept it", _KEEP, _REFUSED))
    elif seed is None:
        out.append(("seed", f"seed set to {p.seed} (was absent)", p.seed, _RANDOM))
    return out


def _temperature(temperature: Any, p: Profile, capability: Capability, model: Any) -> list[tuple[str, str, Any, str]]:
    if temperature is None:
        if p.default_temperature is None:
            return []
        value = p.zero_temperature if p.default_temperature == 0 else p.default_temperature
        return [("temperature", f"temperature set to {value:g} (was absent)", value, _RANDOM)]
    if not (p.fix_sampling and _is_number(temperature)):
        return []
    if temperature == 0 and p.zero_temperature != 0:
        return [("temperature", f"temperature 0 sent as {p.zero_temperature:g} ({p.name} reads 0 as its default)",
                 p.zero_temperature, _RANDOM)]
    if temperature > 0 and temperature != p.zero_temperature:
        seed = ("honours a seed on a best-effort basis only" if capability.honours_seed
                else "does not honour a seed: each call may answer differently")
        return [("temperature", f"temperature {temperature:g} samples; {model} {seed}", _KEEP, _RANDOM)]
    return []


def split_n(body: dict) -> list[dict]:
    """The plan for n > 1: n one-answer requests with seeds seed, seed+1, ..., seed+n-1,
    each keyed and cached on its own. A body without n > 1 is a plan of itself.
    Call after `derandomize`, which fixes the seed."""
    n = body.get("n")
    if not (type(n) is int and n > 1):
        return [body]
    seed = body.get("seed") or 0
    rest = {k: v for k, v in body.items() if k != "n"}
    return [{**rest, "seed": seed + i} for i in range(n)]


def resolve_model(name: str, aliases: Mapping[str, str]) -> tuple[str, bool]:
    """(the pinned model version, whether `name` was an alias). One step only: a pinned
    name is never itself looked up again, so a table cannot loop."""
    pinned = aliases.get(name)
    return (pinned, True) if pinned is not None and pinned != name else (name, False)
