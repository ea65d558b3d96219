"""The contract between the gateway's core and one API surface (one wire format).

The core (routing, tenants, keys, store, single-flight, strategies, metrics) knows a
request only through a `Surface`: how to validate it, its canonical form and which of its
fields stay out of the key, which sampling parameters it has, its stream grammar (which
event is terminal, what makes a complete answer), how a stored answer is rendered for
*this* request, its error shape, and how a vote or a schema check reads an answer.
Adding a surface is one module under `gateway/apis/` and one line in its registry.

An answer is stored once, as an `Entry` built by the surface (`from_body` for a whole
answer, a `Recorder` for a stream), holding both wire forms fixed at write time. Each
request then gets `render(entry, view)`: a pure function of the stored entry and the
parts of the request that are out of the key but shape the bytes (`View`), so the same
request always gets the same bytes, and every reader gets what it asked for.

Echoes: an answer object may repeat fields of the request that are out of the key
(`metadata`, `user`, `store`...). A surface declares them (`echoed`, with the value the
wire shows for a request that left one out); the view carries the reader's own values,
and rendering writes them into the body and into every stream frame that carries the
answer object, live or replayed (`echo_frame`), so no reader is ever shown another's.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator, Mapping

import orjson
from pydantic import TypeAdapter

from gateway.apis.validation import check
from gateway.cache.entry import Entry
from gateway.errors import OPENAI_ERRORS, ErrorShape, UpstreamError
from gateway.policy.canonical import UNKEYED_FIELDS, Canonical, Fields, canonicalize
from gateway.strategies.schema_check import SchemaError
from gateway.upstream.sse import frame


@dataclass(frozen=True)
class View:
    """How one request wants its answer: what it asked for that the key leaves out."""

    stream: bool = False
    usage: bool = False  # a stream that ends with a usage event (OpenAI's include_usage)
    # (field, its JSON) of each field the surface echoes (Surface.echoed), as this reader sent it
    echo: tuple[tuple[str, bytes], ...] = ()


def as_dict(value: Any) -> dict:
    """An object from a body that may hold anything there (an upstream's answer, a client's
    request): the object, or an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    """The same for a list."""
    return value if isinstance(value, list) else []


def with_echo(obj: dict, echo: tuple[tuple[str, bytes], ...]) -> dict | None:
    """`obj` showing the reader's echoed values where it holds those fields; None when it
    already does (the stored bytes are then sent as they are)."""
    changed = {name: orjson.loads(value) for name, value in echo if name in obj and orjson.dumps(obj[name]) != value}
    return {**obj, **changed} if changed else None


@lru_cache(maxsize=1024)  # a few views per surface, asked on every hit
def _needles(echo: tuple[tuple[str, bytes], ...], holder: str) -> tuple[bytes, ...]:
    """What bytes that may hold an echoed member contain: the quoted name of the member
    holding the answer object, or else of an echoed member. A quote inside a JSON string is
    escaped, so only a member's name matches, and most frames are skipped unparsed."""
    return (b'"' + holder.encode() + b'"',) if holder else tuple(b'"' + name.encode() + b'"' for name, _ in echo)


def _may_echo(sent: bytes, view: View, holder: str) -> bool:
    return bool(view.echo) and any(needle in sent for needle in _needles(view.echo, holder))


# Hits replay the same few entries to the same few views: renderings are kept (these are
# pure functions), so a hot hit pays a hash of its bytes rather than a parse.
@lru_cache(maxsize=512)
def _echo_frame(sent: bytes, echo: tuple[tuple[str, bytes], ...], holder: str) -> bytes:
    head, _, rest = sent.partition(b"data: ")
    event = head[len(b"event: "):].strip().decode() if head.startswith(b"event: ") else None
    try:
        payload = orjson.loads(rest)
    except orjson.JSONDecodeError:
        return sent
    obj = payload.get(holder) if isinstance(payload, dict) and holder else payload
    shown = with_echo(obj, echo) if isinstance(obj, dict) else None
    if shown is None:
        return sent
    return frame(orjson.dumps({**payload, holder: shown} if holder else shown), event)


@lru_cache(maxsize=256)
def _echo_body(body: bytes, echo: tuple[tuple[str, bytes], ...]) -> bytes:
    parsed = orjson.loads(body)
    shown = with_echo(parsed, echo) if isinstance(parsed, dict) else None
    return body if shown is None else orjson.dumps(shown)


@lru_cache(maxsize=256)
def _echo_stream(frames: bytes, echo: tuple[tuple[str, bytes], ...], holder: str) -> bytes:
    needles = _needles(echo, holder)
    return b"".join(_echo_frame(one + b"\n\n", echo, holder) if any(n in one for n in needles) else one + b"\n\n"
                    for one in frames.split(b"\n\n")[:-1])


def input_texts(body: dict, name: str) -> Iterator[tuple[str, str]]:
    """(path, text) of a prompt-like field: a string, or a list whose strings are prompts
    (token-id lists hold no text)."""
    value = body.get(name)
    if isinstance(value, str):
        yield name, value
    for i, item in enumerate(value if isinstance(value, list) else ()):
        if isinstance(item, str):
            yield f"{name}[{i}]", item


class NotAnAnswer(UpstreamError):
    """A 200 from the upstream that holds no answer (an error object, no choices, a stream
    cut short): passed on as a failure, never stored."""

    def __init__(self, upstream: str, why: str):
        super().__init__(502, message=f"upstream {upstream!r} answered 200 without an answer: {why}",
                         code="upstream_invalid_answer")


class Recorder:
    """Turns one upstream stream, event by event, into the frames clients are sent and,
    once complete, the entry that stores it. One per upstream call."""

    model = ""  # the model version answering, once an event has said
    fingerprint: str | None = None  # the upstream's build identifier, once an event has said

    def push(self, payload: bytes) -> bytes | None:
        """The frame to send live for one upstream event payload (None: nothing to send).
        Raises UpstreamError for an error event."""
        raise NotImplementedError

    def finish(self) -> Entry:
        """The entry, once the stream has ended; raises NotAnAnswer when it ended incomplete."""
        raise NotImplementedError


class Surface:
    """One wire format. Subclasses set the class attributes and override what differs."""

    name: str  # the route's name: in keys, metrics and logs ("chat.completions")
    path: str  # below /v1 on the gateway and below the upstream's base URL ("/chat/completions")
    # The wire format family ("openai", "anthropic"): which upstreams serve this surface by
    # their profile's default, and how credentials are sent (gateway/upstream/wires.py).
    wire: str = "openai"
    errors: ErrorShape = OPENAI_ERRORS
    # Sampling parameters this wire accepts, by the names the profiles use
    # ("temperature", "top_p", "top_k", "seed", "n"); empty for surfaces that do not sample.
    sampling: frozenset[str] = frozenset()
    # Request headers that change the answer: forwarded upstream and part of the key.
    keyed_headers: tuple[str, ...] = ()
    checks_schemas = False  # whether answers can be schema-checked (x-detgate-schema, tools)
    chains = False  # whether answers name themselves (`answer_id`), so that a later request may continue one
    request: TypeAdapter  # the request's pydantic model: what `validate` checks
    fields: Fields  # the request body's canonical table (gateway/policy/canonical.py)
    unkeyed: frozenset[str] = UNKEYED_FIELDS  # members out of the key, sent as the client sent them
    # Unkeyed members the answer object repeats, each with what it shows for a request that
    # left it out: every reader is shown its own (see `echo_frame`).
    echoed: Mapping[str, Any] = {}
    echo_object = ""  # the member of a stream event's payload that holds the answer object ("": the payload)
    # Whether answers name ids of upstream state (`named_ids`), which the tenant served them may then use.
    names_state = False

    # ---- the request

    def validate(self, body: Any) -> None:
        """Raises ApiError (400) naming the parameter for what no upstream would accept."""
        check(self.request, body)

    def canonical(self, body: dict, text: bool) -> Canonical:
        """The canonical form of a validated, de-randomized body; `text` applies the text
        rules. Raises CanonicalError for a body that has none."""
        return canonicalize(body, self.fields, text, self.unkeyed)

    def refuses(self, body: dict) -> frozenset[str]:
        """Sampling parameters this request's other fields rule out whatever the model takes
        (Anthropic's extended thinking samples at temperature 1, without top_k): never sent."""
        return frozenset()

    def keyed(self, sent: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """The keyed headers as the key is signed over them and the upstream is sent them,
        from those the request sent (lower-cased names, in `keyed_headers` order): where a
        missing header has a default, or a header's spellings mean the same, one form."""
        return sent

    def view(self, body: dict) -> View:
        return View(stream=body.get("stream") is True, echo=self.echo_of(body))

    def echo_of(self, body: dict) -> tuple[tuple[str, bytes], ...]:
        """The reader's own value of each echoed field (the wire's default where it sent none)."""
        return tuple((name, orjson.dumps(body[name] if body.get(name) is not None else default))
                     for name, default in self.echoed.items())

    def upstream_body(self, sent: dict, stream: bool) -> dict:
        """What the upstream is sent, for a streamed or a whole answer."""
        out = {k: v for k, v in sent.items() if k != "stream"}
        if stream:
            out["stream"] = True
        return out

    def uncached(self, body: dict) -> str | None:
        """Why this request is passed through uncached (it asks for no answer now, or
        depends on upstream state no key can name); None when it can be cached."""
        return None

    def state_ids(self, body: dict) -> list[tuple[str, str]]:
        """(param, id) of each id of upstream state the request names besides `parent_id` (a
        conversation, an item reference, a container, a file, a vector store): the tenant
        may name only those it was served or made (gateway/cache/owners.py)."""
        return []

    def apart(self, body: dict) -> str:
        """A name for the answers this request must be kept apart from others of its key
        ("" for none): its key is then bound to that name as well."""
        return ""

    def parent_id(self, body: dict) -> str | None:
        """The id of an earlier answer this request continues (`answer_id` of that answer);
        None when it continues none."""
        return None

    def message_count(self, body: dict) -> int:
        return 0

    def texts(self, body: dict) -> Iterator[tuple[str, str]]:
        """(path, text) for each text the model reads, for a request's preview."""
        return iter(())

    # Members that name a part of an earlier answer (a tool call's id), sent back as it was said.
    resent_members: frozenset[str] = frozenset()

    def resent(self, name: str | None, value: Any) -> bool:
        """Whether a member (`name`) or list item (None) of a keyed request sends back what
        the upstream said earlier (an assistant turn, a tool call's id): a replay repeats it
        as recorded, so the hidden-variable scan passes over it."""
        return name in self.resent_members or (isinstance(value, dict) and value.get("role") == "assistant")

    # ---- the answer

    def from_body(self, upstream: str, payload: bytes) -> Entry:
        """The entry for a whole answer (its stream form synthesized from it); raises
        NotAnAnswer for a 200 that holds none."""
        raise NotImplementedError

    def recorder(self, upstream: str) -> Recorder:
        raise NotImplementedError

    def render(self, entry: Entry, view: View) -> bytes:
        """The bytes one request is sent: the stream when it asked for one, else the body."""
        return entry.body

    def stream_end(self, entry: Entry, view: View) -> bytes:
        """What a live stream sends after its last recorded frame."""
        return b""

    def echo_frame(self, sent: bytes, view: View) -> bytes:
        """A stream frame as this reader is shown it: where its payload carries the answer
        object (`echo_object`), with the reader's echoed values. Live frames and replayed ones
        go through it alike, so a live miss and its replays are the same bytes."""
        return _echo_frame(sent, view.echo, self.echo_object) if _may_echo(sent, view, self.echo_object) else sent

    def echo_body(self, body: bytes, view: View) -> bytes:
        """An answer body with the reader's echoed values."""
        return _echo_body(body, view.echo) if _may_echo(body, view, "") else body

    def echo_stream(self, frames: bytes, view: View) -> bytes:
        """Recorded frames (each ends in a blank line) with the reader's echoed values."""
        return _echo_stream(frames, view.echo, self.echo_object) if view.echo and frames else frames

    def passed_on(self, payload: bytes, view: View) -> tuple[bytes, str]:
        """An answer passed on unfinished with its 200 and never stored (a failed or
        incomplete response), as this reader asked for it: (its bytes, their content type)."""
        return payload, "application/json"

    def in_band_error(self, exc: UpstreamError) -> bytes:
        """The frame that tells a stream's reader the upstream failed after its headers left."""
        return exc.frame(self.errors)

    def fingerprint(self, body: bytes) -> str | None:
        """The upstream's build identifier in an answer, for drift detection."""
        return None

    def answer_id(self, body: bytes) -> str | None:
        """The id an answer body gives itself, by which a later request may continue it
        (`parent_id`); None where the surface has no such ids."""
        return None

    def named_ids(self, body: bytes) -> list[str]:
        """The ids of upstream state an answer names besides its own `answer_id` (output
        items, a conversation, a container), recorded for the tenant it is served to."""
        return []

    def answer_parts(self, parsed: dict) -> list:
        """What an answer says, without what differs on every call (ids, timestamps,
        usage), for canary digests."""
        raise NotImplementedError

    # ---- strategies: votes, n > 1 and schema-validated retries

    def answer_text(self, response: dict) -> str:
        """The answer a vote compares; None-like parts read as empty."""
        raise NotImplementedError

    def merge_n(self, responses: list[dict]) -> dict | None:
        """One response from the answers of n one-answer requests, in order; None where the
        surface has no n."""
        return None

    def requested_schema(self, body: dict) -> tuple[str, dict] | None:
        """(param path, schema) an answer's content must match, as the request asks; None for none."""
        return None

    def tool_schemas(self, body: dict) -> list[tuple[str, Any]]:
        """(param path, parameters schema) of each function tool the request offers."""
        return []

    def problems(self, response: dict, request: dict, schema: dict | None) -> list[SchemaError]:
        """Every schema failure of an answer: tool calls against the offered tools, else
        the content against `schema`."""
        return [SchemaError("$", "", f"{self.name} answers are not checked")]

    def with_feedback(self, request: dict, response: dict, errors: list[SchemaError]) -> dict | None:
        """The request that shows the model its failed answer and the errors; None where
        the surface cannot."""
        return None
