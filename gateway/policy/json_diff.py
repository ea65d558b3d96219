"""Where two JSON documents differ, by JSON path, and how alike they are: what a replay miss
and `detgate cache diff` tell about a request against a recording.

Paths are written as the warnings and errors show them: `messages[2].content[0].text`,
with a member that is not a plain name quoted (`metadata["user-id"]`); `$` is the whole
document.
"""
from __future__ import annotations

import difflib
import os
import re
from collections import Counter
from typing import Any, Iterator, NamedTuple

import orjson

ABSENT = object()  # a member or item one side does not have
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHORT = 60  # characters a shortened value keeps


class Difference(NamedTuple):
    path: str
    recorded: Any  # ABSENT where only the request has it
    sent: Any  # ABSENT where only the recording has it


def member(path: str, name: str) -> str:
    if _NAME.fullmatch(name):
        return f"{path}.{name}" if path else name
    return f"{path or '$'}[{orjson.dumps(name).decode()}]"


def item(path: str, index: int) -> str:
    return f"{path or '$'}[{index}]"


def differences(recorded: Any, sent: Any, path: str = "") -> Iterator[Difference]:
    """Every place the two differ, in document order (the request's member order, then the
    members only the recording has): the deepest path where both still have a container of
    the same kind."""
    if isinstance(recorded, dict) and isinstance(sent, dict):
        for name, value in sent.items():
            yield from differences(recorded.get(name, ABSENT), value, member(path, name))
        for name, value in recorded.items():
            if name not in sent:
                yield Difference(member(path, name), value, ABSENT)
    elif isinstance(recorded, list) and isinstance(sent, list):
        for index in range(max(len(recorded), len(sent))):
            yield from differences(recorded[index] if index < len(recorded) else ABSENT,
                                   sent[index] if index < len(sent) else ABSENT, item(path, index))
    elif recorded is ABSENT or sent is ABSENT or not _same(recorded, sent):
        yield Difference(path or "$", recorded, sent)


def _same(a: Any, b: Any) -> bool:
    # 1 and 1.0 are not one value in a key, and True is not 1.
    return type(a) is type(b) and a == b


def shorten(value: Any, limit: int = SHORT) -> str:
    """A value as JSON, cut to about `limit` characters with how long it was."""
    if value is ABSENT:
        return "(absent)"
    text = orjson.dumps(value).decode()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def shortened(difference: Difference, limit: int = SHORT) -> tuple[str, str]:
    """Both values of a difference, shortened; two long texts around the character where
    they first differ (a 20 KB system prompt that changed one date shows that date)."""
    recorded, sent = difference.recorded, difference.sent
    if not (isinstance(recorded, str) and isinstance(sent, str)) or max(len(recorded), len(sent)) <= limit:
        return shorten(recorded, limit), shorten(sent, limit)
    start = max(0, len(os.path.commonprefix([recorded, sent])) - limit // 3)
    return _window(recorded, start, limit), _window(sent, start, limit)


def _window(text: str, start: int, limit: int) -> str:
    part = orjson.dumps(text[start:start + limit]).decode()
    cut = f"{'...' if start else ''}{part}{'...' if start + limit < len(text) else ''}"
    return f"{cut} ({len(text)} characters{f', from character {start}' if start else ''})"


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, bytes]]:
    if isinstance(value, dict):
        for name, inner in value.items():
            yield from _leaves(inner, member(path, name))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _leaves(inner, item(path, index))
    else:
        yield path, orjson.dumps(value)


def leaves(doc: Any) -> Counter:
    """A document's (path, value) leaves, for `similarity`."""
    return Counter(_leaves(doc))


def similarity(left: Counter, right: Counter) -> float:
    """The share of (path, value) leaves two documents have in common, 0 to 1: a
    conversation that shares more of its messages with a recording, word for word and in
    place, is nearer."""
    total = max(sum(left.values()), sum(right.values()))
    return sum((left & right).values()) / total if total else 1.0


def full(difference: Difference) -> list[str]:
    """A difference in full, for `detgate cache diff`: both values whole, and texts of
    several lines as a unified diff of their lines."""
    recorded, sent = difference.recorded, difference.sent
    if isinstance(recorded, str) and isinstance(sent, str) and "\n" in recorded + sent:
        lines = difflib.unified_diff(recorded.splitlines(), sent.splitlines(), "recorded", "sent", lineterm="")
        return [f"{difference.path}:"] + [f"    {line}" for line in lines]
    return [f"{difference.path}:", f"  - recorded: {_whole(recorded)}", f"  + sent:     {_whole(sent)}"]


def _whole(value: Any) -> str:
    return "(absent)" if value is ABSENT else orjson.dumps(value).decode()
