"""Majority vote among k answers to one request, sampled with seeds seed..seed+k-1.

What is compared is the answer's normalized form (`normalize`):
1. an extractor from config, when there is one: a regex (its group "answer", else
   group 1, else the whole match) or an RFC 6901 JSON pointer into JSON content; an
   answer it cannot extract from falls through to the next steps;
2. canonical JSON (sorted keys, one number form) when the content is JSON, also when
   it is wrapped in one ```json fenced block;
3. the text, trimmed.
Answers are grouped by an xxhash of that form: a fingerprint, not a security boundary.

`decide` stops as soon as the outcome is certain: one group holds a majority of k (for
k=3, two that agree), or leads by more than the answers still to come. When all k are
in and no group leads alone, the tie is broken deterministically: among the largest
groups, the one holding the lowest seed wins. A group's representative, the answer that
gets cached, is its member with the lowest seed. Neither rule looks at arrival order,
so the same answers always elect the same winner whatever the network did.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from gateway.policy.canonical import CanonicalError, value_json


@dataclass(frozen=True)
class Extractor:
    regex: re.Pattern[str] | None = None
    json_pointer: str | None = None


def extractor_from_dict(spec: Mapping[str, Any]) -> Extractor:
    """From config: {"regex": "..."} or {"json_pointer": "/answer"}; ValueError otherwise."""
    unknown = spec.keys() - {"regex", "json_pointer"}
    if unknown or len(spec) != 1:
        raise ValueError("an extractor is exactly one of {'regex': ...} or {'json_pointer': ...}")
    if "regex" in spec:
        try:
            return Extractor(regex=re.compile(spec["regex"]))
        except (re.error, TypeError) as exc:
            raise ValueError(f"extractor regex does not compile: {exc}") from None
    pointer = spec["json_pointer"]
    if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
        raise ValueError(f"extractor json_pointer must be '' or start with '/', got {pointer!r}")
    return Extractor(json_pointer=pointer)


_FENCE = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n(?P<inside>.*?)\n?```\Z", re.S)
_MISSING = object()


def _json(text: str) -> Any:
    fenced = _FENCE.match(text)
    try:
        return orjson.loads(fenced["inside"] if fenced else text)
    except orjson.JSONDecodeError:
        return _MISSING


def _pointer(doc: Any, pointer: str) -> Any:
    for token in pointer.split("/")[1:] if pointer else ():
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list) and token.isdigit() and (token == "0" or token[0] != "0") \
                and int(token) < len(doc):
            doc = doc[int(token)]
        else:
            return _MISSING
    return doc


def _canonical(value: Any) -> str | None:
    try:
        return value_json(value).decode()
    except CanonicalError:
        return None


def _regex_group(match: re.Match[str]) -> str:
    if "answer" in match.re.groupindex:
        return match["answer"] or ""
    return (match[1] or "") if match.re.groups else match[0]


def normalize(content: str, extractor: Extractor | None = None) -> str:
    """The form of an answer that votes are compared on."""
    text = content.strip()
    if extractor is not None and extractor.regex is not None:
        match = extractor.regex.search(content)
        if match is not None:
            return _regex_group(match).strip()
    doc = _json(text)
    if doc is _MISSING:
        return text
    if extractor is not None and extractor.json_pointer is not None:
        value = _pointer(doc, extractor.json_pointer)
        if value is not _MISSING and (form := _canonical(value)) is not None:
            return form
    return _canonical(doc) or text


def tool_calls_text(calls: Iterable[tuple[Any, Any]]) -> str:
    """The answer a vote compares for tool calls, each (name, arguments): one JSON form with
    arguments parsed where they are JSON text, so that calls differing only in how their
    arguments are spelled are one answer."""
    shaped = []
    for name, arguments in calls:
        parsed = _json(arguments) if isinstance(arguments, str) else arguments
        shaped.append({"name": name, "arguments": arguments if parsed is _MISSING else parsed})
    return _canonical(shaped) or ""


def group_of(normalized: str) -> str:
    return xxhash.xxh3_128_hexdigest(normalized.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Ballot:
    seed: int
    group: str  # group_of(normalize(answer))


def ballot(seed: int, content: str, extractor: Extractor | None = None) -> Ballot:
    return Ballot(seed, group_of(normalize(content, extractor)))


@dataclass(frozen=True)
class Vote:
    winner: Ballot            # the winning group's lowest-seed member: the answer to cache
    votes: int                # members of the winning group
    k: int
    cast: int                 # answers counted when the vote was decided
    counts: tuple[tuple[str, int], ...]  # (group, members), largest first, then by lowest seed
    tie_break: bool           # all k were in and the winner did not lead alone

    def header(self) -> str:
        """The x-detgate-votes value: "2/3" is two of k=3 agreeing."""
        return f"{self.votes}/{self.k}"

    def record(self) -> dict[str, Any]:
        """JSON-ready, stored beside the cached answer."""
        return {"votes": self.header(), "k": self.k, "cast": self.cast, "seed": self.winner.seed,
                "tie_break": self.tie_break, "groups": [list(c) for c in self.counts]}


def decide(ballots: Sequence[Ballot], k: int) -> Vote | None:
    """The vote's outcome once it is certain, else None (more answers are needed).

    `ballots` are the answers so far in any order, at most k of them; with all k in, the
    result is never None.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if len(ballots) > k:
        raise ValueError(f"{len(ballots)} answers for a vote of {k}")
    if not ballots:
        return None
    members: dict[str, list[Ballot]] = {}
    for b in ballots:
        members.setdefault(b.group, []).append(b)
    lowest = {g: min(b.seed for b in bs) for g, bs in members.items()}
    ranked = sorted(members, key=lambda g: (-len(members[g]), lowest[g]))
    leader = ranked[0]
    lead = len(members[leader])
    runner_up = len(members[ranked[1]]) if len(ranked) > 1 else 0
    remaining = k - len(ballots)
    majority = lead > k // 2
    unbeatable = lead > runner_up + remaining
    if not (majority or unbeatable or remaining == 0):
        return None
    winner = min(members[leader], key=lambda b: b.seed)
    return Vote(winner=winner, votes=lead, k=k, cast=len(ballots),
                counts=tuple((g, len(members[g])) for g in ranked),
                tie_break=not (majority or unbeatable))
