"""Provider profiles: how to make a request as deterministic as its upstream allows.

A profile says what a provider does with sampling parameters. `derandomize` applies it
to a request body before canonicalization, so the de-randomized parameters are what the
cache key is signed over and what the upstream receives.

| check                 | openai / generic-openai-compatible          | whitebox            |
|-----------------------|---------------------------------------------|---------------------|
| temperature absent    | set to the profile's default (0)            | left to the backend |
| temperature 0         | sent as the profile's `zero_temperature`    | kept                |
| temperature > 0       | kept, with a warning (the seed is best effort) | kept             |
| top_p                 | forced to 1                                 | kept                |
| top_k                 | removed                                     | kept                |
| seed absent           | fixed to the profile's `seed`               | fixed               |
| n > 1                 | a plan of n one-answer requests, or refused, by `n_policy` | same |

The whitebox backend samples from a generator keyed by (seed, step), so any temperature
and top_p replays exactly once the seed is fixed; a black-box provider only promises
"best effort" for a seed, so there everything that adds randomness is taken out.

Modes, per upstream and per request (`x-detgate-mode`):
- `enforce` rewrites and reports each change as a warning;
- `reject` rewrites nothing and raises RandomnessError naming the first parameter that
  `enforce` would have changed or warned about;
- `off` passes the body through untouched.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Mapping

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


PROFILES: dict[str, Profile] = {
    "openai": Profile("openai"),
    "generic-openai-compatible": Profile("generic-openai-compatible"),
    "whitebox": Profile("whitebox", default_temperature=None, fix_sampling=False, votes=False),
}


def profile_from_dict(spec: Mapping[str, Any], known: Mapping[str, Profile] = PROFILES) -> Profile:
    """A user-defined profile from config: `name`, optionally `base` (a known profile it
    starts from, default generic-openai-compatible) and any Profile field to override.

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
    profile = dataclasses.replace(known[base_name], name=name, **spec)
    _check(profile)
    return profile


def _check(p: Profile) -> None:
    if p.default_temperature is not None and not (_is_number(p.default_temperature)
                                                  and p.default_temperature >= 0):
        raise ValueError(f"profile {p.name!r}: default_temperature must be a number >= 0 or null")
    if not _is_number(p.zero_temperature) or not 0 <= p.zero_temperature < 0.01:
        raise ValueError(f"profile {p.name!r}: zero_temperature must be in [0, 0.01), "
                         f"a stand-in for 0, got {p.zero_temperature!r}")
    if type(p.fix_sampling) is not bool:
        raise ValueError(f"profile {p.name!r}: fix_sampling must be true or false")
    if type(p.votes) is not bool:
        raise ValueError(f"profile {p.name!r}: votes must be true or false")
    if type(p.seed) is not int:
        raise ValueError(f"profile {p.name!r}: seed must be an integer")
    if p.n_policy not in ("split", "reject"):
        raise ValueError(f"profile {p.name!r}: n_policy must be 'split' or 'reject'")


def _is_number(x: Any) -> bool:
    return type(x) in (int, float)


def parse_mode(value: str) -> Mode:
    """A mode from config or the x-detgate-mode header; ValueError names the choices."""
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"unknown mode {value!r}; expected one of {', '.join(MODES)}")
    return mode  # type: ignore[return-value]


class RandomnessError(ValueError):
    """A request refused because `param` adds randomness; `error()` is the OpenAI-shaped body."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param

    def error(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error",
                          "param": self.param, "code": "nondeterministic_parameter"}}


def derandomize(sampling: frozenset[str], body: dict, profile: Profile, mode: Mode) -> tuple[dict, list[str]]:
    """(the body to canonicalize and send, one warning per change made).

    `sampling` is the surface's sampling parameters (none: nothing to de-randomize).
    Never mutates `body`. Raises RandomnessError in `reject` mode for the first parameter
    that adds randomness, and in both modes for n > 1 when the profile refuses it.
    With n > 1 under a `split` profile, the body keeps its n: `split_n` makes the plan.
    Warnings are short ASCII, fit for a header.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "off" or not sampling:
        return body, []
    changes = _changes(body, profile)
    if mode == "reject" and changes:
        param, message, _ = changes[0]
        raise RandomnessError(param, message)
    n = body.get("n")
    if type(n) is int and n > 1 and profile.n_policy == "reject":
        raise RandomnessError("n", f"n={n} is not supported by the {profile.name} profile: "
                              f"send {n} requests with distinct seeds instead")
    if mode == "reject":
        return body, []
    out = dict(body)
    if profile.fix_sampling and "top_p" in sampling and out.get("top_p") is None:
        out["top_p"] = 1  # an absent top_p already means 1: made explicit, not a change
    for param, _, value in changes:
        if value is _DROP:
            out.pop(param, None)
        elif value is not _KEEP:
            out[param] = value
    return out, [message for _, message, _ in changes]


def changed_params(sampling: frozenset[str], body: dict, profile: Profile, mode: Mode) -> list[str]:
    """The parameters `derandomize` changes or warns about, one per warning, in its order
    (for counting rewrites by parameter)."""
    if mode == "off" or not sampling:
        return []
    return [param for param, _, _ in _changes(body, profile)]


_KEEP = object()  # a warning only: the parameter stays as sent
_DROP = object()


def _changes(body: dict, p: Profile) -> list[tuple[str, str, Any]]:
    """(param, message, new value or _KEEP/_DROP) for each parameter that adds randomness."""
    out = []
    temperature = body.get("temperature")
    if temperature is None:
        if p.default_temperature is not None:
            value = p.zero_temperature if p.default_temperature == 0 else p.default_temperature
            out.append(("temperature", f"temperature set to {value:g} (was absent)", value))
    elif p.fix_sampling and _is_number(temperature):
        if temperature == 0 and p.zero_temperature != 0:
            out.append(("temperature", f"temperature 0 sent as {p.zero_temperature:g} "
                        f"({p.name} reads 0 as its default)", p.zero_temperature))
        elif temperature > 0 and temperature != p.zero_temperature:
            out.append(("temperature", f"temperature {temperature:g} samples; {p.name} honours "
                        "a seed on a best-effort basis only", _KEEP))
    if p.fix_sampling:
        top_p = body.get("top_p")
        if top_p is not None and top_p != 1:
            out.append(("top_p", f"top_p forced to 1 (was {top_p})", 1))
        if "top_k" in body:
            out.append(("top_k", "top_k removed", _DROP))
    if body.get("seed") is None:
        out.append(("seed", f"seed set to {p.seed} (was absent)", p.seed))
    return out


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


# Public model names -> the dated snapshot they pointed at when this table was written.
# Config overrides it (alias_table); a name not in the table is taken as already pinned.
DEFAULT_ALIASES: dict[str, str] = {
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


def alias_table(overrides: Mapping[str, str | None] = {}) -> dict[str, str]:
    """DEFAULT_ALIASES with config's overrides; an override to None un-pins a name."""
    table = {**DEFAULT_ALIASES, **overrides}
    return {name: pinned for name, pinned in table.items() if pinned is not None}


def resolve_model(name: str, aliases: Mapping[str, str] = DEFAULT_ALIASES) -> tuple[str, bool]:
    """(the pinned model version, whether `name` was an alias). One step only: a pinned
    name is never itself looked up again, so a table cannot loop."""
    pinned = aliases.get(name)
    return (pinned, True) if pinned is not None and pinned != name else (name, False)
