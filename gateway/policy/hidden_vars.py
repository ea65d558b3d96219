"""Hidden variables: values in a prompt that make its cache key never repeat.

An app that puts "Current time: 2026-11-22T16:17:30Z" or a fresh request id into every
prompt gets a new key, and a new upstream answer, on every call. `find` reports such
spans so the gateway can warn; it never changes the request.

| kind       | what                                                 | flagged        |
|------------|------------------------------------------------------|----------------|
| `datetime` | ISO 8601 date and time: 2026-11-22T16:17:30Z         | date near now  |
| `date`     | 2026-11-22, 22.11.2026, 11/22/2026, 2026/11/22, Nov 22, 2026, 22 November 2026 | near now |
| `epoch`    | Unix time in s/ms/us/ns: 10/13/16/19 digits          | near now       |
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
"""
from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

DEFAULT_WINDOW_S = 86_400.0

KINDS = ("datetime", "date", "epoch", "uuid", "hex_id", "token_id")


@dataclass(frozen=True)
class Finding:
    kind: str
    start: int
    end: int
    path: str = ""  # where in the request, for scan(); "" for find()


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


def scan(texts: Iterable[tuple[str, str]], now: float, window_s: float = DEFAULT_WINDOW_S) -> list[Finding]:
    """Hidden variables in every (path, text) a model reads in a request (its surface's
    `texts`), each finding with its path.

    Costs up to a few tens of nanoseconds per character near digits: run it on cache
    misses only, since a hit already proves the request's key repeats."""
    return [Finding(f.kind, f.start, f.end, path)
            for path, text in texts for f in find(text, now, window_s)]


def warning(findings: list[Finding]) -> str | None:
    """One short ASCII line for x-detgate-warnings, or None when nothing was found."""
    if not findings:
        return None
    kinds = sorted({f.kind for f in findings}, key=KINDS.index)
    where = findings[0].path or "text"
    return (f"prompt holds values that change per request ({', '.join(kinds)}; first at "
            f"{where}[{findings[0].start}:{findings[0].end}]): every such request misses the cache")

