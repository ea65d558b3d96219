"""Key rules: volatile values left out of the cache key and forwarded unchanged.

A coding agent puts values into every request that change from run to run and day to day
without changing the question: today's date in a reminder, the wall time a command took.
A key rule rewrites such a value in the key only (the upstream is sent the request as it
came), so a recorded agent session replays on another day. Two kinds:

| rule                          | what the key reads                                           |
|-------------------------------|--------------------------------------------------------------|
| `path` alone                  | nothing: the value at each matching JSON path is left out    |
| `pattern` (+ `path`)          | each match of the regex in keyed text (at `path` when given) replaced by `replace` |

Paths are those of the canonical key, as the hidden-variable warning prints them:
`client_metadata`, `input[3].id`; `[*]` is any index, `*` any one member name, `**` any
number of steps (`**.id`); a leading `$.` is allowed.

Built-in rules, per agent recognised by its `user-agent` (`recognise`), were read off real
requests of each CLI (the bookkeeping that every client's request carries, such as Codex's
`client_metadata`, item ids, Claude Code's `metadata`, is out of the key whatever the rules:
see the surfaces). Every rule that fired is signed into the key (`schema`): a gateway with
other rules, or none, never serves the entry, and the same request under rules that did not
fire keys as it always has.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

# (agent, a regex its user-agent header starts with)
_AGENTS = (
    ("claude-code", re.compile(r"claude-cli/")),
    ("codex", re.compile(r"codex_[a-z_]+/")),  # codex_exec/, codex_cli_rs/, codex_vscode/
    ("openai-agents", re.compile(r"Agents/Python ")),
)

AgentRules = Literal["auto", "on", "off"]


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern:
    return re.compile(pattern)


@functools.lru_cache(maxsize=256)
def _path(pattern: str) -> re.Pattern:
    """A path pattern as a regex over the printed path ("input[3].id")."""
    pattern = pattern[2:] if pattern.startswith("$.") else pattern.lstrip("$")
    out = []
    for token in re.findall(r"\*\*\.?|\[\*\]|\*|[^*\[]+|\[", pattern):
        if token.startswith("**"):
            out.append(r"(?:.*\.)?" if token.endswith(".") else r".*")
        elif token == "[*]":
            out.append(r"\[\d+\]")
        elif token == "*":
            out.append(r"[^.\[]+")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out))


class KeyRule(BaseModel):
    """One rule, as the TOML config writes it (`[[key_rules]]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    path: str | None = Field(None, min_length=1)
    pattern: str | None = Field(None, min_length=1)
    replace: str = ""

    @model_validator(mode="after")
    def _complete(self) -> KeyRule:
        if self.path is None and self.pattern is None:
            raise ValueError(f"key rule {self.name!r} needs a path (left out of the key) or a pattern")
        if self.pattern is not None:
            try:
                _regex(self.pattern).sub(self.replace, "")
            except (re.error, IndexError) as exc:
                raise ValueError(f"key rule {self.name!r}: {exc}") from None
        if self.path is not None:
            _path(self.path)
        return self


def _builtin(name: str, pattern: str, replace: str) -> KeyRule:
    return KeyRule(name=name, pattern=pattern, replace=replace)


# Read off captured requests of Claude Code 2.1 and Codex 0.171 (two runs, and one a day later).
BUILTIN: dict[str, tuple[KeyRule, ...]] = {
    "claude-code": (
        # "# currentDate\nToday's date is 2026-11-28." in a <system-reminder> user text block.
        _builtin("claude-code:date", r"Today's date is \d{4}-\d{2}-\d{2}\.", "Today's date is <date>."),
    ),
    "codex": (
        # <environment_context> ... <current_date>2026-11-28</current_date>
        _builtin("codex:current-date", r"<current_date>\d{4}-\d{2}-\d{2}</current_date>",
                 "<current_date><date></current_date>"),
        # An exec tool's report: "Wall time 0.1 seconds" (0.171), "Wall time: 0.0012 seconds" (unified
        # exec), a line of its own. Written literal first, the line start checked behind it: a regex
        # led by (?m)^ is tried at every character of the long texts around it (10x slower).
        _builtin("codex:wall-time", r"Wall time(?<![^\n]Wall time):? \d+(?:\.\d+)? seconds(?![^\n])",
                 "Wall time <seconds> seconds"),
        # Unified exec names each chunk of a running command's output.
        _builtin("codex:chunk-id", r"Chunk ID(?<![^\n]Chunk ID): \S+(?![^\n])", "Chunk ID: <id>"),
    ),
    # The SDK adds nothing volatile of its own: an app's dates are the app's to cover.
    "openai-agents": (),
}


def recognise(user_agent: str | None) -> str | None:
    """The agent a request comes from, by its user-agent header; None for any other client."""
    if user_agent:
        for agent, prefix in _AGENTS:
            if prefix.match(user_agent):
                return agent
    return None


def applicable(agent: str | None, mode: str, agent_rules: AgentRules,
               user_rules: tuple[KeyRule, ...]) -> tuple[KeyRule, ...]:
    """The rules a request is keyed under: the user's always; a recognised agent's built-in
    ones in record and replay modes ("auto"), everywhere ("on") or nowhere ("off")."""
    builtin = agent_rules == "on" or (agent_rules == "auto" and mode in ("record", "replay"))
    return (*(BUILTIN.get(agent, ()) if builtin and agent else ()), *user_rules)


def schema(fired: Iterable[KeyRule]) -> bytes:
    """What the key is signed over for the rules that fired: each one's whole definition
    (nothing when none fired, so such a key is the one it always was)."""
    fired = tuple(fired)
    return orjson.dumps([rule.model_dump() for rule in fired]) if fired else b""


def warning(fired: tuple[str, ...]) -> str | None:
    """What x-detgate-warnings (and so the access log) says when rules fired; None when none did."""
    if not fired:
        return None
    return f"key rules left values out of the key, sent upstream unchanged: {', '.join(fired)}"


def apply(key: Any, rules: tuple[KeyRule, ...]) -> tuple[Any, tuple[KeyRule, ...]]:
    """(the key with `rules` applied, the rules that fired in their order). Never mutates
    `key`: containers are copied along the paths that changed, keeping their type (an
    OrderedObject stays one)."""
    if not rules:
        return key, ()
    fired: set[str] = set()
    with_paths = any(rule.path is not None for rule in rules)
    out = _walk(key, "" if with_paths else None, rules, fired)
    return out, tuple(rule for rule in rules if rule.name in fired)


def _walk(value: Any, path: str | None, rules: tuple[KeyRule, ...], fired: set[str]) -> Any:
    if isinstance(value, str):
        for rule in rules:
            if rule.pattern is not None and (rule.path is None or _path(rule.path).fullmatch(path)):
                changed = _regex(rule.pattern).sub(rule.replace, value)
                if changed != value:
                    fired.add(rule.name)
                    value = changed
        return value
    if isinstance(value, dict):
        out, changed = {}, False
        for name, member in value.items():
            inner = None if path is None else (f"{path}.{name}" if path else name)
            if inner is not None and _dropped(inner, rules, fired):
                changed = True
                continue
            out[name] = _walk(member, inner, rules, fired)
            changed = changed or out[name] is not member
        if not changed:
            return value
        return out if type(value) is dict else type(value)(out)
    if isinstance(value, list):
        items, changed = [], False
        for i, item in enumerate(value):
            inner = None if path is None else f"{path}[{i}]"
            if inner is not None and _dropped(inner, rules, fired):
                changed = True
                continue
            items.append(_walk(item, inner, rules, fired))
            changed = changed or items[-1] is not item
        return items if changed else value
    return value


def _dropped(path: str, rules: tuple[KeyRule, ...], fired: set[str]) -> bool:
    for rule in rules:
        if rule.pattern is None and _path(rule.path).fullmatch(path):
            fired.add(rule.name)
            return True
    return False
