"""What a model accepts: the sampling parameters it takes and whether it honours a seed.

A surface's `sampling` says which parameters its wire format has; a model's capability
says which of those the model behind it takes. OpenAI's reasoning models answer 400 to a
`temperature` or `top_p`; Anthropic's models have no `seed`. The policy reads the table
both ways: `enforce` never sends a parameter the model refuses (and says so in a
warning), `reject` answers 400 naming it. A seed the model refuses is still chosen and
carried by the key (n > 1 parts and voters stay apart), it is just not sent.

Rows are fnmatch globs over the model name (as routed, and as pinned), first match wins:
config's rows, then the built-in ones, then `ANY` for a model nobody described. In TOML:

    [capabilities."my-o3-deployment*"]
    accepts = ["seed"]          # of temperature, top_p, top_k, seed
    honours_seed = false
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable, Literal

from pydantic import BaseModel, ConfigDict

Param = Literal["temperature", "top_p", "top_k", "seed"]
PARAMS: frozenset[str] = frozenset({"temperature", "top_p", "top_k", "seed"})


@dataclass(frozen=True)
class Capability:
    accepts: frozenset[str]  # of PARAMS
    honours_seed: bool  # whether one seed replays a sampled answer (best effort at most, on a black box)


class CapabilitySpec(BaseModel):
    """One config row."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accepts: tuple[Param, ...]
    honours_seed: bool = True

    def capability(self) -> Capability:
        return Capability(frozenset(self.accepts), self.honours_seed and "seed" in self.accepts)


# A model nobody described: the profile decides what it is sent.
ANY = Capability(PARAMS, honours_seed=True)

# OpenAI's reasoning models take no temperature or top_p (they sample at their own) and
# no top_k (no OpenAI model does); they take a seed, with no promise that it replays
# anything. gpt-5-chat is the GPT-5 that is not a reasoning model: it takes both.
_OPENAI_CHAT = Capability(frozenset({"temperature", "top_p", "seed"}), honours_seed=True)
_OPENAI_REASONING = Capability(frozenset({"seed"}), honours_seed=False)
# Claude has no seed. Opus 4.7 and every model after it answer 400 to any temperature,
# top_p or top_k. The models before take temperature, and since Opus 4.1 refuse it beside
# a top_p: top_p is never sent (the de-randomized 1 means the same as none), top_k is.
_CLAUDE = Capability(frozenset({"temperature", "top_k"}), honours_seed=False)
_CLAUDE_UNSAMPLED = Capability(frozenset(), honours_seed=False)
BUILT_IN: tuple[tuple[str, Capability], ...] = (
    ("gpt-5-chat*", _OPENAI_CHAT),
    ("gpt-5*", _OPENAI_REASONING),
    ("o1*", _OPENAI_REASONING),
    ("o3*", _OPENAI_REASONING),
    ("o4*", _OPENAI_REASONING),
    *((glob, _CLAUDE_UNSAMPLED) for glob in ("claude-opus-4-7*", "claude-opus-4-8*", "claude-opus-5*",
                                            "claude-sonnet-5*", "claude-haiku-5*", "claude-fable-*",
                                            "claude-mythos-*")),
    ("claude-*", _CLAUDE),
)


@dataclass(frozen=True)
class Capabilities:
    rows: tuple[tuple[str, Capability], ...]  # config's rows, then BUILT_IN

    def of(self, *names: str) -> Capability:
        """The capability of the first row whose glob matches any of `names`, else ANY."""
        for glob, capability in self.rows:
            if any(fnmatchcase(name, glob) for name in names):
                return capability
        return ANY


def table(configured: Iterable[tuple[str, CapabilitySpec]] = ()) -> Capabilities:
    """Config's rows before the built-in ones."""
    return Capabilities((*((glob, spec.capability()) for glob, spec in configured), *BUILT_IN))
