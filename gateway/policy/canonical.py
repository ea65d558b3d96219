"""The canonical form of a request: the bytes a cache key is signed over, and what is sent.

The invariant: two requests share a key only if every provider would treat them alike,
and the upstream is sent a body that both askers would accept as their own. So the key
and the body sent are made by one pass (`canonicalize`), and a rule exists only where
the equivalence holds for every provider that speaks the wire.

Each surface describes the JSON objects it knows (the request body, a message, a content
part, a tool, a response format, ...) as `Fields`: each known member with its rule, the
members whose null means absent, and the members whose provider-defined default means
absent. The rest is kept:

| what                                          | member order               | numbers              | text            |
|-----------------------------------------------|----------------------------|----------------------|-----------------|
| an object the gateway knows                   | means nothing: sorted in the key | as written, except float parameters (`number_form`) | text rules where its table says |
| a member the gateway does not know, an object of a type it does not know, a JSON schema wherever it sits | kept exactly as sent (`OrderedObject`) | kept as written: `1.0` stays `1.0` | kept |

A schema is a contract on the output bytes: property order decides the order a
constrained decoder generates fields in ("reasoning" before "answer"), `enum`, `const`,
`default` and `examples` may be emitted as literals, `pattern` must match exactly. That
holds for `response_format.json_schema.schema`, function `parameters`, Fireworks' and
Together's `response_format: {type: "json_object", schema}`, vLLM's `guided_json` and
`structured_outputs.json`, and any field a provider adds tomorrow: the gateway cannot
know what a decoder it does not know does with order, so what it does not know it keeps.

Text rules, on the app's own prompt text (message content strings and text/refusal parts,
message names, tool and function descriptions, json_schema descriptions, completion
prompts and suffixes, embedding inputs), where the request's text setting allows them
(per upstream `canonical = "text"` (default) or `"json-only"`, per request
`x-detgate-canonical`). Never on data the app passes on (`as_data`): a tool's output
(chat `tool` messages, Anthropic `tool_result`, Responses `function_call_output`),
documents, files. An agent that reads a file with a BOM, CRLF line ends or a decomposed
"é" must see them, and an edit it builds from what it saw must match the file, so data
reaches the upstream byte for byte and is keyed as sent:

| rule          | what                                                | why                                                 |
|---------------|-----------------------------------------------------|-----------------------------------------------------|
| `bom`         | U+FEFF removed                                      | an editor artefact, never meant as text             |
| `zero_width`  | U+200B zero-width space removed                     | copy-paste debris from web pages and word processors|
| `word_joiner` | U+2060 word joiner removed                          | same                                                |
| `crlf`        | CRLF becomes LF; a lone CR stays                    | the platform a prompt was typed on is not its meaning; a lone CR is (`10%\\r100%` is a progress line) |
| `nfc`         | NFC composition, except the characters NFC replaces even standing alone, which stay as typed | composed and decomposed "é" are one text; the Kelvin sign is not "K" |

The characters kept from NFC are computed from `unicodedata` (`KEPT_FROM_NFC`): the
singleton decompositions (Kelvin sign, Ohm sign, Angstrom sign, U+037E GREEK QUESTION
MARK, U+0387, CJK compatibility ideographs, ...) and the other composition exclusions
(Devanagari and Bengali nukta letters, Tibetan vowel signs, Hebrew presentation forms,
...). Composition runs on the text between them. Never NFKC: "²" is not "2".

Kept on purpose: U+200D ZWJ and U+200C ZWNJ (they build emoji sequences, "👨‍👩‍👧" is one
family and "👨👩👧" three people, and Persian and Indic scripts need them); bidi marks and
embeddings (U+200E/F, U+202A-E, U+2066-9) because they change how text reads; variation
selectors (U+FE0E/F) because they choose text or emoji presentation; soft hyphen U+00AD and
the invisible math operators U+2061-4, because a model sees each as a token and a request
may mean them. Not touched by text rules: stop sequences (matched literally against the
output), tool call arguments, data URLs, base64 audio/files, token ids, unknown members,
JSON schemas.

Shape rules (they apply whatever the text setting):

| rule            | equivalent forms unified                                        |
|-----------------|-----------------------------------------------------------------|
| `content_shape` | a content list holding one plain text part -> that text         |
| `input_shape`   | prompt/input `["x"]` -> `"x"`, `[[1, 2]]` -> `[1, 2]` (the response holds one item either way) |
| `stop_shape`    | stop sequences deduplicated in their order (vLLM stops at the first listed one that matches: order is meaning, never sorted), one -> a string |
| `null_field`    | a known optional member set to null -> absent                   |
| `default_value` | a known member set to its provider-defined default -> absent (each surface's table: `n: 1`, `stop: []`, `logprobs: false`, penalties `0`, `response_format: {type: text}`, image `detail: "auto"`, ...) |
| `number_form`   | a float parameter's integral value -> an int (`temperature: 1.0` is `1`); nowhere else |
| `unkeyed_field` | a member that cannot change the answer: out of the key, sent upstream exactly as the client sent it (table below) |
| `unkeyed_member` | a nested member that cannot change the answer (`unkeyed`): an id a client made up for its own bookkeeping (a Responses input item's `id`), a hint for the provider's prompt cache (Anthropic `cache_control`); out of the key, sent as it came |

Unkeyed fields (`UNKEYED_FIELDS`):

| field                          | why it cannot change the answer                                |
|--------------------------------|----------------------------------------------------------------|
| `user`, `safety_identifier`    | abuse-monitoring identifiers (forwarded: without them OpenAI holds the operator's whole organisation responsible) |
| `stream`, `stream_options`     | transport: the stored answer is rendered per request           |
| `metadata`, `store`            | whether and how the provider keeps the completion              |
| `prompt_cache_key`, `prompt_cache_retention`, `prompt_cache_options` | hints for the provider's prefix cache |
| `service_tier`                 | price and latency of processing, not the model; the answer's `service_tier` reports the tier it was made on |

Identical requests in flight at once share one upstream call, so an unkeyed field reaches
the upstream as the first of them sent it. Ids that name state the upstream keeps
(`previous_response_id`, an `item_reference`, a reasoning item's id) or pair a tool call
with its output (`call_id`, `tool_use_id`) are keyed: they change what the model reads.

Deliberately not unified: `max_tokens` vs `max_completion_tokens` (reasoning models
reject the first, so the pair is not equivalent everywhere); `parallel_tool_calls`,
`encoding_format`, `prediction`, `top_logprobs` (each changes the response or is not
defaulted alike everywhere); a default a provider does not define (filling in sampling
parameters is the profile's job, before this step).

Each rule appends its name to `Canonical.rules` once per place it changed (per string,
per member, per number), so a metric over those names shows how dirty inputs are.
"""
from __future__ import annotations

import functools
import itertools
import math
import operator
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import orjson

# Every name Canonical.rules can hold, for pre-registering metric labels.
TEXT_RULES = ("bom", "zero_width", "word_joiner", "crlf", "nfc")
RULES = (*TEXT_RULES, "content_shape", "input_shape", "stop_shape", "null_field", "default_value",
         "number_form", "unkeyed_field", "unkeyed_member")

# The request's text setting (upstream `canonical`, header x-detgate-canonical).
TEXT_SETTINGS = ("text", "json-only")

# Members of every OpenAI-style request that cannot change the answer: out of the key,
# forwarded as the client sent them.
UNKEYED_FIELDS = frozenset({
    "user", "safety_identifier", "stream", "stream_options", "metadata", "store",
    "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "service_tier",
})

_REMOVED_CHARS = (("\ufeff", "bom"), ("\u200b", "zero_width"), ("\u2060", "word_joiner"))


def _kept_from_nfc() -> str:
    """Every character NFC replaces even when it stands alone (NFC_Quick_Check=No)."""
    everything = itertools.chain(range(0xD800), range(0xE000, 0x110000))  # no surrogates
    return "".join(itertools.filterfalse(functools.partial(unicodedata.is_normalized, "NFC"), map(chr, everything)))


KEPT_FROM_NFC = _kept_from_nfc()
_KEPT = re.compile("([" + re.escape(KEPT_FROM_NFC) + "])")

# orjson writes integers in this range.
_INT_MIN, _INT_END = -(2**63), 2**64


class OrderedObject(dict):
    """A JSON object kept exactly as sent: its member order, and everything inside it.

    `canonical_json` sorts the members of every other object but keeps the order of this
    one and of everything inside it. It is a plain dict to every other reader, so the body
    can be forwarded upstream as it is.
    """


class Unkeyed:
    """A value sent upstream as the client sent it and left out of the key (`unkeyed`):
    a marker in the tree the canonical pass builds, gone from both of its results."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class CanonicalError(ValueError):
    """A request that has no canonical form (a non-finite number, an integer beyond 64
    bits, a string that is not valid Unicode). `param` is the JSON path of the culprit,
    for the `param` of a 400."""

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


class Trace(list):
    """The names of the rules that fired, in order, and whether text rules apply: what
    every rule is handed besides its value."""

    def __init__(self, text: bool = True) -> None:
        super().__init__()
        self.text = text
        self.unkeyed = False  # whether the tree holds an Unkeyed member, so key and sent differ


FieldRule = Callable[[Any, Trace], Any]


@dataclass(frozen=True)
class Fields:
    """One kind of JSON object the gateway knows. Its member order means nothing; each
    member in `rules` is rewritten by its rule; a member not in `rules` is unknown and
    kept exactly as sent."""

    rules: Mapping[str, FieldRule]
    nullable: frozenset[str] = frozenset()  # members whose null means absent
    defaults: Mapping[str, Any] = field(default_factory=dict)  # members whose value here means absent


def canonicalize(body: Any, fields: Fields, text: bool = True, unkeyed: frozenset[str] = UNKEYED_FIELDS) -> Canonical:
    """The canonical form of a request body under one surface's table; `text` applies the
    text rules; `unkeyed` members stay out of the key and are sent as they came. Never
    mutates `body`.

    Raises CanonicalError for a body that has no canonical form.
    """
    if not isinstance(body, dict):
        raise CanonicalError("the request body must be a JSON object")
    trace = Trace(text)
    keyed, forwarded = {}, {}
    for name, value in body.items():
        if name in unkeyed:
            trace.append("unkeyed_field")
            forwarded[name] = value
        else:
            keyed[name] = value
    tree = known(keyed, fields, trace)
    if trace.unkeyed:
        key, sent = _settle_both(tree, False)
    else:
        key = sent = _settle(tree, False, False)
    return Canonical(key, {**sent, **forwarded}, tuple(trace))


def known(obj: Any, fields: Fields, trace: Trace) -> Any:
    """An object the gateway knows, member by member (see `Fields`); anything that is not
    an object where one was expected is kept as sent."""
    if not isinstance(obj, dict):
        return verbatim(obj)
    out = {}
    for name, value in obj.items():
        rule = fields.rules.get(name)
        if rule is None:
            out[name] = verbatim(value)
        elif value is None and name in fields.nullable:
            trace.append("null_field")
        else:
            value = rule(value, trace)
            if name in fields.defaults and _same(value, fields.defaults[name]):
                trace.append("default_value")
            else:
                out[name] = value
    return out


def _same(value: Any, default: Any) -> bool:
    # False is not 0 and 0 is not 0.0 here: a default is matched in its own type.
    if type(value) is not type(default):
        return False
    if isinstance(value, dict):
        return value.keys() == default.keys() and all(_same(value[k], default[k]) for k in value)
    if isinstance(value, list):
        return len(value) == len(default) and all(map(_same, value, default))
    return value == default


def canonical_json(obj: Any) -> bytes:
    """THE serialization that is signed: compact, members sorted except inside an
    OrderedObject, numbers written as they are (1 and 1.0 differ: only a rule that knows
    a member takes a number by value makes them one).

    Raises CanonicalError for values JSON cannot carry faithfully (NaN, infinities,
    integers beyond 64 bits, lone surrogates): orjson would write NaN as null, which would
    make two different requests one.
    """
    return _dumps(_settle(obj, False, False))


def settled_json(key: Any) -> bytes:
    """`canonical_json` of a `Canonical.key`, also after key rules rewrote its strings or
    dropped members: that tree is already settled, so it is only written. Settling it again
    cost ~0.4 ms of every request carrying a coding agent's 80 KB body."""
    return _dumps(key)


def value_json(obj: Any) -> bytes:
    """`canonical_json` for comparing JSON by value (answers in a vote): every integral
    float written as an int, so 1 and 1.0 are one value."""
    return _dumps(_settle(obj, False, True))


def _dumps(settled: Any) -> bytes:
    try:
        return orjson.dumps(settled)
    except orjson.JSONEncodeError as exc:
        raise CanonicalError(f"not serializable as JSON: {exc}") from None


def text_warning(rules: tuple[str, ...]) -> str | None:
    """What x-detgate-warnings says when text rules changed the request; None when none did."""
    fired = [rule for rule in TEXT_RULES if rule in rules]
    if not fired:
        return None
    return f"text canonicalized ({', '.join(fired)}); x-detgate-canonical: json-only sends it as written"


# ---------------------------------------------------------------- rules

def plain(value: Any, trace: Trace) -> Any:
    """A known member whose value the provider reads by name and value (a string, a flag,
    an object of its own API): nothing to rewrite, and its objects' order means nothing."""
    return value


def unkeyed(value: Any, trace: Trace) -> Any:
    """A member that cannot change the answer (an id a client makes up for its own
    bookkeeping, a prompt-cache hint): out of the key, sent exactly as it came."""
    trace.append("unkeyed_member")
    trace.unkeyed = True
    return Unkeyed(value)


def as_data(rule: FieldRule) -> FieldRule:
    """Data the app passes on (a tool's output, a file it read), read by `rule` with the
    text rules off: shape rules still apply, the text is kept byte for byte."""
    def rule_data(value: Any, trace: Trace) -> Any:
        was, trace.text = trace.text, False
        try:
            return rule(value, trace)
        finally:
            trace.text = was
    return rule_data


def verbatim(value: Any, trace: Trace | None = None) -> Any:
    """Kept exactly as sent: each object in it becomes an OrderedObject."""
    if isinstance(value, dict):
        return value if isinstance(value, OrderedObject) else OrderedObject(value)
    if isinstance(value, list):
        return [verbatim(item) for item in value]
    return value


def schema(value: Any, trace: Trace) -> Any:
    """A JSON schema: a contract on the output bytes, kept exactly as sent."""
    return verbatim(value)


def number(value: Any, trace: Trace) -> Any:
    """A float parameter: an integral value written as an int."""
    if type(value) is float and value.is_integer() and _INT_MIN <= value < _INT_END:
        trace.append("number_form")
        return int(value)
    return value


def numbers(value: Any, trace: Trace) -> Any:
    """An object of float parameters (logit_bias)."""
    return {k: number(v, trace) for k, v in value.items()} if isinstance(value, dict) else value


def each(rule: FieldRule) -> FieldRule:
    """A list whose every item is read by `rule`."""
    def rule_each(value: Any, trace: Trace) -> Any:
        return [rule(item, trace) for item in value] if isinstance(value, list) else verbatim(value)
    return rule_each


def of(fields: Fields) -> FieldRule:
    """A member whose value is an object `fields` describes."""
    def rule_of(value: Any, trace: Trace) -> Any:
        return known(value, fields, trace)
    return rule_of


def by_type(types: Mapping[str, Fields]) -> FieldRule:
    """A member whose value is an object described by its "type"; an object of a type not
    in `types` is kept exactly as sent."""
    def rule_by_type(value: Any, trace: Trace) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        fields = types.get(kind) if isinstance(kind, str) else None
        return known(value, fields, trace) if fields is not None else verbatim(value)
    return rule_by_type


def text(s: str, trace: Trace) -> str:
    if not trace.text:
        return s
    for char, rule in _REMOVED_CHARS:
        if char in s:
            s = s.replace(char, "")
            trace.append(rule)
    if "\r\n" in s:
        s = s.replace("\r\n", "\n")
        trace.append("crlf")
    # Last, so that a removed character no longer blocks a composition.
    composed = compose(s)
    if composed != s:
        trace.append("nfc")
    return composed


def compose(s: str) -> str:
    """NFC, except that the characters in KEPT_FROM_NFC stay as typed and nothing composes across them."""
    if unicodedata.is_normalized("NFC", s):
        return s
    parts = _KEPT.split(s)  # runs at even indexes, kept characters at odd ones
    return "".join(unicodedata.normalize("NFC", part) if i % 2 == 0 else part for i, part in enumerate(parts))


def text_field(value: Any, trace: Trace) -> Any:
    return text(value, trace) if isinstance(value, str) else verbatim(value)


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def inputs(value: Any, trace: Trace) -> Any:
    """Completion prompts and embedding inputs: a string, strings, token ids, token-id lists."""
    if isinstance(value, list) and len(value) == 1 and (
        isinstance(value[0], str) or _is_token_list(value[0])
    ):
        value = value[0]
        trace.append("input_shape")
    if isinstance(value, str):
        return text(value, trace)
    if isinstance(value, list):
        return [text(item, trace) if isinstance(item, str) else item for item in value]
    return value


def stop(value: Any, trace: Trace) -> Any:
    # The first listed sequence that matches ends the output (vLLM checks in list order):
    # duplicates can go, the order stays.
    if not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return value
    unique: list[str] | str = list(dict.fromkeys(value))
    if len(unique) == 1:
        unique = unique[0]
    if unique != value:
        trace.append("stop_shape")
    return unique


def content_of(part: FieldRule, text_type: str = "text") -> FieldRule:
    """A message's content: a string, or a list of parts each read by `part`. A list of one
    plain text part (`{"type": text_type, "text": ...}` and nothing else) is that text,
    as every API that has both forms defines it."""
    def rule_content(value: Any, trace: Trace) -> Any:
        if not isinstance(value, list):
            return text_field(value, trace)
        if len(value) == 1 and isinstance(value[0], dict) and value[0].keys() == {"type", "text"} \
                and value[0]["type"] == text_type and isinstance(value[0]["text"], str):
            trace.append("content_shape")
            return text(value[0]["text"], trace)
        return [part(item, trace) for item in value]
    return rule_content


# OpenAI's chat content parts and message, function and tool objects, shared by the
# surfaces that speak them.
IMAGE_URL = Fields({"url": plain, "detail": plain}, nullable=frozenset({"detail"}), defaults={"detail": "auto"})
PART_TYPES: dict[str, Fields] = {
    "text": Fields({"type": plain, "text": text_field}),
    "refusal": Fields({"type": plain, "refusal": text_field}),
    "image_url": Fields({"type": plain, "image_url": of(IMAGE_URL)}),
    "input_audio": Fields({"type": plain, "input_audio": plain}),
    "file": Fields({"type": plain, "file": plain}),
}
content = content_of(by_type(PART_TYPES))

MESSAGE = Fields(
    {"role": plain, "content": content, "name": text_field, "refusal": text_field, "tool_calls": plain,
     "tool_call_id": plain, "function_call": plain, "audio": plain},
    nullable=frozenset({"audio", "content", "function_call", "name", "refusal", "tool_call_id", "tool_calls"}),
)
# A tool's (or a legacy function's) answer is data: its content is sent as the tool wrote it.
TOOL_MESSAGE = Fields({**MESSAGE.rules, "content": as_data(content)}, MESSAGE.nullable)


def message(value: Any, trace: Trace) -> Any:
    tool = isinstance(value, dict) and value.get("role") in ("tool", "function")
    return known(value, TOOL_MESSAGE if tool else MESSAGE, trace)


messages = each(message)

FUNCTION = Fields({"name": plain, "description": text_field, "parameters": schema, "strict": plain},
                  nullable=frozenset({"description", "parameters", "strict"}))
function = of(FUNCTION)
functions = each(function)
tools = each(by_type({"function": Fields({"type": plain, "function": function})}))

JSON_SCHEMA = Fields({"name": plain, "description": text_field, "schema": schema, "strict": plain},
                     nullable=frozenset({"description", "schema", "strict"}))
# A json_object format's other members (Fireworks' and Together's `schema`) are unknown, so kept as sent.
response_format = by_type({"text": Fields({"type": plain}), "json_object": Fields({"type": plain}),
                           "json_schema": Fields({"type": plain, "json_schema": of(JSON_SCHEMA)})})


# ---------------------------------------------------------------- serialization

def _settle(value: Any, ordered: bool, by_value: bool, keyed: bool = True) -> Any:
    """A fresh copy of a JSON value with members sorted outside OrderedObjects (and
    integral floats as ints when `by_value`); CanonicalError, with its path, for what JSON
    cannot carry. An Unkeyed member is left out when `keyed`, else its value is kept as sent."""
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
        if by_value and value.is_integer() and _INT_MIN <= value < _INT_END:
            return int(value)
        return value
    if isinstance(value, dict):
        ordered = ordered or isinstance(value, OrderedObject)
        out = {}
        for name in _names(value, ordered):
            member = value[name]
            if isinstance(member, Unkeyed):
                if keyed:
                    continue
                member = verbatim(member.value)
            try:
                out[name] = _settle(member, ordered, by_value, keyed)
            except CanonicalError as exc:
                raise exc.under(name) from None
        return OrderedObject(out) if ordered else out
    if isinstance(value, (list, tuple)):
        items = []
        for i, item in enumerate(value):
            try:
                items.append(_settle(item, ordered, by_value, keyed))
            except CanonicalError as exc:
                raise exc.under(i) from None
        return items
    raise CanonicalError(f"not a JSON value: {kind.__name__}")


def _names(obj: dict, ordered: bool) -> list[str]:
    """An object's member names in the order they are written."""
    names = list(obj)
    if not all(type(name) is str for name in names):
        raise CanonicalError("object keys must be strings")
    if not ordered:
        names.sort()
    return names


def _settle_both(value: Any, ordered: bool) -> tuple[Any, Any]:
    """(the key, what is sent): `_settle` of a tree holding Unkeyed members, keyed and not,
    in one walk rather than two (each is ~0.3 ms of a coding agent's 80 KB body). The two
    share every part that holds no Unkeyed member."""
    if isinstance(value, dict):
        ordered = ordered or isinstance(value, OrderedObject)
        key, sent, same = {}, {}, True
        for name in _names(value, ordered):
            member = value[name]
            try:
                if isinstance(member, Unkeyed):
                    sent[name], same = _settle(verbatim(member.value), ordered, False, False), False
                    continue
                key[name], sent[name] = _settle_both(member, ordered)
            except CanonicalError as exc:
                raise exc.under(name) from None
            same = same and key[name] is sent[name]
        key = OrderedObject(key) if ordered else key
        return (key, key) if same else (key, OrderedObject(sent) if ordered else sent)
    if isinstance(value, (list, tuple)):
        keys, sents = [], []
        for i, item in enumerate(value):
            try:
                k, s = _settle_both(item, ordered)
            except CanonicalError as exc:
                raise exc.under(i) from None
            keys.append(k)
            sents.append(s)
        return (keys, keys) if all(map(operator.is_, keys, sents)) else (keys, sents)
    settled = _settle(value, ordered, False)
    return settled, settled
