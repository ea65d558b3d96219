"""Hidden variables: values in a request that make its cache key never repeat.

An app that puts "Current time: 2026-11-22T16:17:30Z" or a fresh request id into every
request gets a new key, and a new upstream answer, on every call. `scan` walks the whole
keyed body (prompt text, metadata that is keyed, ids, tool outputs, members the gateway does
not know) and reports each such value with its JSON path and the key rule
(gateway/policy/key_rules.py) that would leave it out of the key; it never changes the request.

| kind       | what                                                 | flagged        |
|------------|------------------------------------------------------|----------------|
| `datetime` | ISO 8601 date and time: 2026-11-22T16:17:30Z         | date near now  |
| `date`     | 2026-11-22, 22.11.2026, 11/22/2026, 2026/11/22, Nov 22, 2026, 22 November 2026 | near now |
| `epoch`    | Unix time in s/ms/us/ns: 10/13/16/19 digits, in text or as a JSON number | near now |
| `uuid`     | 8-4-4-4-12 hex                                       | always         |
| `hex_id`   | 16+ hex characters, digits and letters mixed         | always         |
| `token_id` | 20+ base64(url) characters mixing upper, lower and digits, looking random | always |

"Looking random": the character class (upper, lower, digit, other) changes at 40% or more
of positions (random base64 about 64%, identifiers and paths mostly 25-40%), and fewer
than 60% of the capitals start a word of three or more letters (camelCase: most do).
Dates are compared as calendar days (the window rounded up to whole days, so a
client's time zone cannot hide today's date); a historical or future date far from now is
ordinary content. Times without a date are not flagged: "at 14:05:33" in a transcript is
content far more often than a clock. The caller passes `now`, keeping this module pure.

Not scanned: what the upstream said earlier and the request sends back (an assistant turn,
a tool call's id, a reasoning item: the surface's `resent`), which a replay repeats as it
was recorded, and blobs (a data URL, an unbroken token of over 200 characters: images,
signatures, encrypted content), which are data rather than values an app varies.
"""
from __future__ import annotations

import datetime as dt
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import xxhash

DEFAULT_WINDOW_S = 86_400.0

KINDS = ("datetime", "date", "epoch", "uuid", "hex_id", "token_id")


@dataclass(frozen=True)
class Finding:
    kind: str
    start: int
    end: int
    path: str = ""  # the JSON path of the value in the keyed request, for scan(); "" for find()
    rule: str = ""  # the key rule that would leave it out of the key (TOML), for scan()


_MONTHS = {name: i + 1 for i, name in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])}
_MONTH = (r"(?P<mon>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
          r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"

# Word-ish boundaries: a match may not run into letters, digits or token characters.
_B = r"(?<![A-Za-z0-9])"
_E = r"(?![A-Za-z0-9])"

_DATETIME = re.compile(
    _B + r"(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
    r"(?:Z|[+-]\d{2}:?\d{2})?" + _E, re.A)
_ISO_DATE = re.compile(_B + r"(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})" + _E, re.A)
_YMD = re.compile(_B + r"(?P<y>\d{4})[/.](?P<m>\d{1,2})[/.](?P<d>\d{1,2})" + _E, re.A)
_DMY_OR_MDY = re.compile(_B + r"(?P<a>\d{1,2})[/.](?P<b>\d{1,2})[/.](?P<y>\d{4})" + _E, re.A)
_WRITTEN_MDY = re.compile(_B + _MONTH + r"\.?\s+" + _DAY + r",?\s+(?P<y>\d{4})" + _E, re.I | re.A)
_WRITTEN_DMY = re.compile(_B + _DAY + r"\s+(?:of\s+)?" + _MONTH + r"\.?,?\s+(?P<y>\d{4})" + _E, re.I | re.A)
_EPOCH = re.compile(_B + r"(?P<int>\d{10}|\d{13}|\d{16}|\d{19})(?:\.\d+)?" + _E, re.A)
_UUID = re.compile(_B + r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}" + _E)
_HEX = re.compile(r"(?<![A-Za-z0-9_\-+/])(?:[0-9a-f]{16,}|[0-9A-F]{16,})(?![A-Za-z0-9_\-+/])")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_\-+/])[A-Za-z0-9_\-+/]{20,}={0,2}(?![A-Za-z0-9_\-+/=])")


def _day(y: int, m: int, d: int) -> dt.date | None:
    try:
        return dt.date(y, m, d)
    except ValueError:
        return None


def _near_day(day: dt.date | None, now: float, window_s: float) -> bool:
    if day is None:
        return False
    today = dt.datetime.fromtimestamp(now, dt.timezone.utc).date()
    return abs((day - today).days) <= math.ceil(window_s / 86_400)


def _dates(text: str, now: float, window_s: float) -> Iterator[Finding]:
    for m in _DATETIME.finditer(text):
        if _near_day(_day(int(m["y"]), int(m["m"]), int(m["d"])), now, window_s):
            yield Finding("datetime", m.start(), m.end())
    for pattern in (_ISO_DATE, _YMD):
        for m in pattern.finditer(text):
            if _near_day(_day(int(m["y"]), int(m["m"]), int(m["d"])), now, window_s):
                yield Finding("date", m.start(), m.end())
    for m in _DMY_OR_MDY.finditer(text):
        y, a, b = int(m["y"]), int(m["a"]), int(m["b"])
        if any(_near_day(day, now, window_s) for day in (_day(y, b, a), _day(y, a, b))):
            yield Finding("date", m.start(), m.end())
    for pattern in (_WRITTEN_MDY, _WRITTEN_DMY):
        for m in pattern.finditer(text):
            day = _day(int(m["y"]), _MONTHS[m["mon"][:3].lower()], int(m["day"]))
            if _near_day(day, now, window_s):
                yield Finding("date", m.start(), m.end())


def _epochs(text: str, now: float, window_s: float) -> Iterator[Finding]:
    for m in _EPOCH.finditer(text):
        digits = m["int"]
        seconds = int(digits) / 10 ** (len(digits) - 10)
        if abs(seconds - now) <= window_s:
            yield Finding("epoch", m.start(), m.end())


def _class(c: str) -> int:
    return 0 if c.isdigit() else 1 if c.isupper() else 2 if c.islower() else 3


_WORD_START = re.compile(r"[A-Z][a-z]{2}")


def _looks_random(token: str) -> bool:
    body = token.rstrip("=")
    classes = [_class(c) for c in body]
    if not {0, 1, 2} <= set(classes):
        return False
    switches = sum(a != b for a, b in zip(classes, classes[1:]))
    # In camelCase most capitals start a word; in random text about one in six does.
    words = len(_WORD_START.findall(body))
    return switches >= 0.4 * (len(classes) - 1) and words < 0.6 * classes.count(1)


def _ids(text: str) -> Iterator[Finding]:
    for m in _UUID.finditer(text):
        yield Finding("uuid", m.start(), m.end())
    for m in _HEX.finditer(text):
        token = m.group()
        if any(c.isdigit() for c in token) and not token.isdigit():
            yield Finding("hex_id", m.start(), m.end())
    for m in _TOKEN.finditer(text):
        if _looks_random(m.group()):
            yield Finding("token_id", m.start(), m.end())


# Every kind needs a digit, so only the neighbourhood of digits is searched: ordinary
# prose costs one scan for digits instead of one scan per pattern. The neighbourhood
# reaches far enough for a written date ("September 22nd, 2026") and is widened to
# whitespace, so a window never cuts a token and the patterns' boundaries stay exact.
_DIGITS = re.compile(r"[0-9]+")
_SPACE = re.compile(r"\s")
_REACH = 32


def _windows(text: str) -> Iterator[tuple[int, int]]:
    start = end = -1
    for m in _DIGITS.finditer(text):
        if m.start() <= end:
            if m.end() + _REACH > end:
                end = _widen_right(text, m.end() + _REACH)
            continue
        if end >= 0:
            yield start, end
        start = max(m.start() - _REACH, 0)
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        end = _widen_right(text, m.end() + _REACH)
    if end >= 0:
        yield start, end


def _widen_right(text: str, at: int) -> int:
    space = _SPACE.search(text, at)
    return space.start() if space else len(text)


def find(text: str, now: float, window_s: float = DEFAULT_WINDOW_S) -> list[Finding]:
    """Hidden variables in `text` (now: Unix seconds), in text order, none overlapping:
    where two detectors claim the same characters, the one listed first in KINDS wins."""
    if not any(d in text for d in "0123456789"):
        return []
    found = []
    for start, end in _windows(text):
        part = text[start:end]
        for f in (*_dates(part, now, window_s), *_epochs(part, now, window_s), *_ids(part)):
            found.append(Finding(f.kind, f.start + start, f.end + start))
    found.sort(key=lambda f: (KINDS.index(f.kind), f.start))
    kept: list[Finding] = []
    for f in found:
        if all(f.end <= k.start or f.start >= k.end for k in kept):
            kept.append(f)
    return sorted(kept, key=lambda f: f.start)


# (member name or None for a list item, value) -> whether the value echoes an earlier answer.
Resent = Callable[[str | None, Any], bool]
_BLOB = 200


def scan(body: Any, now: float, resent: Resent | None = None, window_s: float = DEFAULT_WINDOW_S) -> list[Finding]:
    """Hidden variables anywhere in a keyed request body (strings and numbers, paths as the
    key rules name them), skipping what `resent` says the upstream said earlier.

    Costs up to a few tens of nanoseconds per character near digits: run it on cache
    misses only, since a hit already proves the request's key repeats."""
    out: list[Finding] = []
    _scan(body, "", now, window_s, resent or (lambda name, value: False), out)
    return out


def _scan(value: Any, path: str, now: float, window_s: float, resent: Resent, out: list[Finding]) -> None:
    if isinstance(value, str):
        if not value.startswith("data:") and not (len(value) > _BLOB and not any(c.isspace() for c in value)):
            found = find(value, now, window_s) if len(value) < _LONG else _find_long(value, now, window_s)
            out.extend(Finding(f.kind, f.start, f.end, path, _rule(f, value, path)) for f in found)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        text = str(value)
        out.extend(Finding(f.kind, f.start, f.end, path, _rule(f, text, path)) for f in find(text, now, window_s))
    elif isinstance(value, dict):
        for name, member in value.items():
            if not resent(name, member):
                _scan(member, f"{path}.{name}" if path else str(name), now, window_s, resent, out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not resent(None, item):
                _scan(item, f"{path}[{i}]", now, window_s, resent, out)


# An agent sends its system prompt and tool descriptions (tens of KB) again on every turn:
# what was found in a long text is remembered, by its digest and the hour (so "near now"
# moves on), and only the new parts of a turn are searched.
_LONG = 1024
_MEMO: dict[tuple[int, int, float], tuple[Finding, ...]] = {}  # first in, first out
_MEMO_SIZE = 512
_MEMO_LOCK = threading.Lock()  # gateways may run on several threads of one process


def _find_long(text: str, now: float, window_s: float) -> tuple[Finding, ...]:
    key = (xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass")), int(now // 3600), window_s)
    found = _MEMO.get(key)
    if found is None:
        found = tuple(find(text, key[1] * 3600.0, window_s))
        with _MEMO_LOCK:
            if len(_MEMO) >= _MEMO_SIZE:
                del _MEMO[next(iter(_MEMO))]
            _MEMO[key] = found
    return found


# ---- the key rule that would cover a finding

_SPECIAL = set(".^$*+?{}[]\\|()")
_SHAPES = {"uuid": r"[0-9a-fA-F-]{36}", "hex_id": r"[0-9a-fA-F]{16,}", "token_id": r"[A-Za-z0-9_+/=-]{20,}"}
_INDEX = re.compile(r"\[\d+\]")


def _escaped(text: str) -> str:
    """`text` as a regex in a TOML literal string: printable ASCII, no quote."""
    out = []
    for c in text:
        if c == "\t":
            out.append(r"\t")
        elif c == "'" or not (c.isascii() and c.isprintable()):
            out.append(".")
        else:
            out.append("\\" + c if c in _SPECIAL else c)
    return "".join(out)


def _shape(kind: str, span: str) -> str:
    """A regex that matches `span` and the other values of its kind: digit runs by length."""
    if kind in _SHAPES:
        return _SHAPES[kind]
    return "".join(rf"\d{{{len(run)}}}" if run[0].isdigit() else "[A-Za-z]+" if run[0].isalpha() else _escaped(run)
                   for run in re.findall(r"\d+|[A-Za-z]+|[^\dA-Za-z]+", span))


def _rule(f: Finding, text: str, path: str) -> str:
    """The key rule (a TOML inline table) that leaves the value out of the key: its path when
    it is the whole value, else a pattern led by the words before it on its line."""
    if f.start == 0 and f.end == len(text):
        return f'{{name = "{f.kind}", path = "{_printable(_INDEX.sub("[*]", path))}"}}'
    line = text.rfind("\n", 0, f.start) + 1
    before = text[max(line, f.start - 24):f.start]
    if f.start - 24 > line and " " in before:
        before = before[before.index(" ") + 1:]  # from a word's start
    lead = f"(?<={_escaped(before)})" if before else ""
    return f"{{name = \"{f.kind}\", pattern = '{lead}{_shape(f.kind, text[f.start:f.end])}', replace = \"<{f.kind}>\"}}"


def _printable(text: str) -> str:
    """Safe in a header and in a TOML basic string."""
    return "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "?" for c in text)


def warning(findings: list[Finding]) -> str | None:
    """One short ASCII line for x-detgate-warnings and the access log, or None when nothing
    was found: the kinds, where the first few are, the key rule for the first."""
    if not findings:
        return None
    kinds = sorted({f.kind for f in findings}, key=KINDS.index)
    first = findings[0]
    where = f"first at {_printable(first.path) or 'text'}[{first.start}:{first.end}]"
    others = list(dict.fromkeys(_printable(f.path) for f in findings if f.path != first.path))
    if others:
        where += f"; also at {', '.join(others[:3])}" + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return (f"request holds values that change per request ({', '.join(kinds)}; {where}): every such request "
            f"misses the cache; a key rule leaves the first out: key_rules = [{first.rule}]")
