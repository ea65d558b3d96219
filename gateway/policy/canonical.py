"""The canonical form of an OpenAI-style request: the bytes a cache key is signed over.

Two requests that must get the same answer should get the same canonical bytes, and two
that may get different answers must not. Everything here errs toward the second: a shape
rule exists only where the equivalence holds for every OpenAI-compatible provider, and
the text rules remove only characters nobody types on purpose. The canonical body has
its object keys sorted (except inside JSON schemas, below) and is also what the gateway
sends upstream, so the upstream answers exactly the request the key stands for.

Text rules, applied to text the model reads (message content strings and text/refusal
parts, message names, tool and function descriptions, json_schema descriptions,
completion prompts and suffixes, embedding inputs):

| rule          | what                                   | why                                                  |
|---------------|----------------------------------------|------------------------------------------------------|
| `bom`         | U+FEFF removed                         | an editor artefact, never meant as text              |
| `zero_width`  | U+200B zero-width space removed        | copy-paste debris from web pages and word processors |
| `word_joiner` | U+2060 word joiner removed             | same                                                 |
| `crlf`        | CRLF and lone CR become LF             | the platform a prompt was typed on is not its meaning|
| `nfc`         | Unicode NFC (never NFKC: "²" is not "2")| composed and decomposed "é" are the same text        |

Kept on purpose: U+200D ZWJ and U+200C ZWNJ (they build emoji sequences, "👨‍👩‍👧" is one
family and "👨👩👧" three people, and Persian and Indic scripts need them); bidi marks and
embeddings (U+200E/F, U+202A-E, U+2066-9) because they change how text reads; variation
selectors (U+FE0E/F) because they choose text or emoji presentation; soft hyphen U+00AD and
the invisible math operators U+2061-4, because a model sees each as a token and a request
may mean them.

Not touched by text rules: stop sequences (matched literally against the output), tool
call arguments, data URLs, base64 audio/files, token-id arrays, unknown fields, and JSON
schemas. A schema is a contract on the output bytes: `pattern`, `enum`, `const` and
property names must match exactly, and property order decides the order structured
outputs generate fields in (so "reasoning" before "answer" stays that way). Schemas are
therefore kept verbatim, key order included (see `OrderedObject`).

Shape rules:

| rule            | equivalent forms unified                                        |
|-----------------|-----------------------------------------------------------------|
| `content_shape` | a content list holding one plain text part -> that text         |
| `input_shape`   | prompt/input `["x"]` -> `"x"`, `[[1, 2]]` -> `[1, 2]` (the response holds one item either way) |
| `stop_shape`    | stop sequences as a set: sorted, deduplicated, one -> a string  |
| `null_field`    | a known optional field set to null -> absent                    |
| `number_form`   | an integral float -> an int (`1.0` -> `1`), everywhere          |
| `dropped_field` | a field that cannot change the answer removed (table below)     |

Dropped fields:

| field               | why it cannot change the answer                                 |
|---------------------|-----------------------------------------------------------------|
| `user`, `safety_identifier` | abuse-monitoring identifiers                             |
| `stream`, `stream_options`  | transport: a stored answer is served in either form       |
| `metadata`, `store` | whether and how the provider keeps the completion               |
| `prompt_cache_key`  | a routing hint for the provider's prefix cache                  |
| `service_tier`      | price and latency of processing, not the model; the stored answer's `service_tier` field reports the tier it was made on |

Deliberately not unified: `max_tokens` vs `max_completion_tokens` (reasoning models
reject the first, so the pair is not equivalent everywhere); `parallel_tool_calls`,
`logprobs`, `encoding_format` and `prediction` (each changes the response); default
values vs absent fields (defaults differ between providers: filling them in is the
provider profile's job, before this step). Unknown fields are kept as sent.

Each rule appends its name to `Canonical.rules` once per place it changed (per string,
per field, per number), so a metric over those names shows how dirty inputs are.
"""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

import orjson

# Every name Canonical.rules can hold, for pre-registering metric labels.
RULES = ("bom", "zero_width", "word_joiner", "crlf", "nfc", "content_shape", "input_shape",
         "stop_shape", "null_field", "number_form", "dropped_field")

_MESSAGE_NULLABLE = frozenset({
    "audio", "content", "function_call", "name", "refusal", "tool_call_id", "tool_calls",
})
_FUNCTION_NULLABLE = frozenset({"description", "parameters", "strict"})
_JSON_SCHEMA_NULLABLE = frozenset({"description", "schema", "strict"})

# Fields of every OpenAI-style request that cannot change the answer: out of the key,
# forwarded as the client sent them.
UNKEYED_FIELDS = frozenset({
    "user", "safety_identifier", "stream", "stream_options", "metadata", "store",
    "prompt_cache_key", "service_tier",
})

_REMOVED_CHARS = (("\ufeff", "bom"), ("\u200b", "zero_width"), ("\u2060", "word_joiner"))

# orjson writes integers in this range; an integral float inside it becomes that int.
_INT_MIN, _INT_END = -(2**63), 2**64


class OrderedObject(dict):
    """A JSON object whose key order means something (a JSON schema).

    `canonical_json` sorts the keys of every other object but keeps the order of this one
    and of everything inside it. It is a plain dict to every other reader, so the body can
    be forwarded upstream as it is.
    """


class CanonicalError(ValueError):
    """A request that has no canonical form (a non-finite number, an integer beyond 64
    bits, a string that is not valid Unicode). `param` is the JSON path of the culprit,
    for the `param` of an OpenAI-shaped 400."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ()):
        super().__init__(message)
        self.path = path

    @property
    def param(self) -> str | None:
        out = ""
        for step in self.path:
            out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
        return out or None

    def under(self, step: str | int) -> CanonicalError:
        return CanonicalError(str(self), (step, *self.path))


@dataclass(frozen=True)
class Canonical:
    key: dict  # what the cache key is signed over
    sent: dict  # what the upstream is sent: `key` plus the unkeyed fields as the client sent them
    rules: tuple[str, ...]  # the rules that fired, one name per place changed


FieldRule = Callable[[Any, list[str]], Any]


def canonicalize(body: dict, nullable: frozenset[str], field_rules: dict[str, FieldRule],
                 unkeyed: frozenset[str] = UNKEYED_FIELDS) -> Canonical:
    """The canonical form of a request body under one surface's tables: `nullable` fields
    set to null count as absent, each field in `field_rules` is rewritten by its rule,
    `unkeyed` fields stay out of the key. Never mutates `body`.

    Raises CanonicalError for a body that has no canonical form.
    """
    if not isinstance(body, dict):
        raise CanonicalError("the request body must be a JSON object")
    fired: list[str] = []
    kept, forwarded = {}, {}
    for name, value in body.items():
        if name in unkeyed:
            fired.append("dropped_field")
            forwarded[name] = value
        elif value is None and name in nullable:
            fired.append("null_field")
        else:
            kept[name] = value
    for name, rule in field_rules.items():
        if name in kept:
            kept[name] = rule(kept[name], fired)
    key = _settle(kept, fired, False)
    return Canonical(key, {**key, **forwarded}, tuple(fired))


def canonical_json(obj: Any) -> bytes:
    """THE serialization that is signed: compact, keys sorted (except inside an
    OrderedObject), integral floats written as ints, so 1 and 1.0 give the same bytes.

    Raises CanonicalError for values JSON cannot carry faithfully (NaN, infinities,
    integers beyond 64 bits, lone surrogates): orjson would write NaN as null, which would
    make two different requests one.
    """
    settled = _settle(obj, None, False)
    try:
        return orjson.dumps(settled)
    except orjson.JSONEncodeError as exc:
        raise CanonicalError(f"not serializable as JSON: {exc}") from None


def text(s: str, fired: list[str]) -> str:
    for char, rule in _REMOVED_CHARS:
        if char in s:
            s = s.replace(char, "")
            fired.append(rule)
    if "\r" in s:
        s = s.replace("\r\n", "\n").replace("\r", "\n")
        fired.append("crlf")
    # Last, so that a removed character no longer blocks a composition.
    if not unicodedata.is_normalized("NFC", s):
        s = unicodedata.normalize("NFC", s)
        fired.append("nfc")
    return s


def text_field(value: Any, fired: list[str]) -> Any:
    return text(value, fired) if isinstance(value, str) else value


def _object(obj: dict, nullable: frozenset[str], rules: dict[str, FieldRule], fired: list[str]) -> dict:
    """`obj` without its known optional fields set to null, each field in `rules` rewritten by its rule."""
    out = {}
    for name, value in obj.items():
        if value is None and name in nullable:
            fired.append("null_field")
        else:
            out[name] = value
    for name, rule in rules.items():
        if name in out:
            out[name] = rule(out[name], fired)
    return out


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def inputs(value: Any, fired: list[str]) -> Any:
    """Completion prompts and embedding inputs: a string, strings, token ids, token-id lists."""
    if isinstance(value, list) and len(value) == 1 and (
        isinstance(value[0], str) or _is_token_list(value[0])
    ):
        value = value[0]
        fired.append("input_shape")
    if isinstance(value, str):
        return text(value, fired)
    if isinstance(value, list):
        return [text(item, fired) if isinstance(item, str) else item for item in value]
    return value


def stop(value: Any, fired: list[str]) -> Any:
    # Generation halts at the first match of any sequence, so they form a set.
    if not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return value
    unique: list[str] | str = sorted(set(value))
    if len(unique) == 1:
        unique = unique[0]
    if unique != value:
        fired.append("stop_shape")
    return unique


def _is_plain_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.keys() == {"type", "text"}
        and part["type"] == "text" and isinstance(part["text"], str)
    )


def content_part(part: Any, fired: list[str]) -> Any:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in ("text", "refusal") and isinstance(part.get(kind), str):
        return {**part, kind: text(part[kind], fired)}
    return part


def content(value: Any, fired: list[str]) -> Any:
    if isinstance(value, list):
        if len(value) == 1 and _is_plain_text_part(value[0]):
            fired.append("content_shape")
            value = value[0]["text"]
        else:
            return [content_part(part, fired) for part in value]
    return text_field(value, fired)


def message(message: Any, fired: list[str]) -> Any:
    if not isinstance(message, dict):
        return message
    return _object(message, _MESSAGE_NULLABLE, MESSAGE_RULES, fired)


def messages(value: Any, fired: list[str]) -> Any:
    return [message(m, fired) for m in value] if isinstance(value, list) else value


def schema(value: Any, fired: list[str]) -> Any:
    return OrderedObject(value) if isinstance(value, dict) else value


def function(function: Any, fired: list[str]) -> Any:
    if not isinstance(function, dict):
        return function
    return _object(function, _FUNCTION_NULLABLE, _FUNCTION_RULES, fired)


def functions(value: Any, fired: list[str]) -> Any:
    return [function(f, fired) for f in value] if isinstance(value, list) else value


def tool(tool: Any, fired: list[str]) -> Any:
    if isinstance(tool, dict) and tool.get("type") == "function" and "function" in tool:
        return {**tool, "function": function(tool["function"], fired)}
    return tool


def tools(value: Any, fired: list[str]) -> Any:
    return [tool(t, fired) for t in value] if isinstance(value, list) else value


def response_format(value: Any, fired: list[str]) -> Any:
    if not (isinstance(value, dict) and value.get("type") == "json_schema"
            and isinstance(value.get("json_schema"), dict)):
        return value
    return {**value, "json_schema": _object(value["json_schema"], _JSON_SCHEMA_NULLABLE, _JSON_SCHEMA_RULES, fired)}


MESSAGE_RULES: dict[str, FieldRule] = {"content": content, "name": text_field}
_FUNCTION_RULES: dict[str, FieldRule] = {"description": text_field, "parameters": schema}
_JSON_SCHEMA_RULES: dict[str, FieldRule] = {"description": text_field, "schema": schema}


def _settle(value: Any, fired: list[str] | None, ordered: bool) -> Any:
    """A fresh copy of a JSON value with keys sorted (outside OrderedObjects) and integral
    floats as ints; `fired` collects number_form firings when given."""
    kind = type(value)
    if isinstance(value, str) or kind is bool or value is None:
        return value
    if kind is int:
        if not _INT_MIN <= value < _INT_END:
            raise CanonicalError("integer out of the 64-bit range")
        return value
    if kind is float:
        if not math.isfinite(value):
            raise CanonicalError("number is not finite")
        if value.is_integer() and _INT_MIN <= value < _INT_END:
            if fired is not None:
                fired.append("number_form")
            return int(value)
        return value
    if isinstance(value, dict):
        ordered = ordered or isinstance(value, OrderedObject)
        names = list(value)
        if not all(type(name) is str for name in names):
            raise CanonicalError("object keys must be strings")
        if not ordered:
            names.sort()
        out = {}
        for name in names:
            try:
                out[name] = _settle(value[name], fired, ordered)
            except CanonicalError as exc:
                raise exc.under(name) from None
        return OrderedObject(out) if ordered else out
    if isinstance(value, (list, tuple)):
        items = []
        for i, item in enumerate(value):
            try:
                items.append(_settle(item, fired, ordered))
            except CanonicalError as exc:
                raise exc.under(i) from None
        return items
    raise CanonicalError(f"not a JSON value: {kind.__name__}")
