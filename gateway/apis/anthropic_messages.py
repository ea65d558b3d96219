"""Anthropic Messages (`POST /v1/messages`), as api.anthropic.com and the providers that
copy its wire speak it.

Canonical form, beside the generic rules of gateway/policy/canonical.py:

| field            | rule                                                                     |
|------------------|--------------------------------------------------------------------------|
| `system`         | one plain text block -> its string (the API's own shorthand); text rules |
| message `content`| same: one plain text block -> its string; text rules on text blocks      |
| `tool_result`    | its `content` as message content, but data: no text rules                |
| `tool_use.input` | kept in its order: the model reads the arguments as they were written    |
| `thinking`, `redacted_thinking` blocks | verbatim: the signature covers the text    |
| image, document  | verbatim                                                                 |
| `tools`          | descriptions get the text rules; `input_schema` kept verbatim, in order  |
| `stop_sequences` | kept as sent, in order                                                   |
| `temperature`, `top_p` | an integral float is an int (`1.0` is `1`)                         |
| `metadata`, `service_tier`, `stream` | out of the key, forwarded                            |
| `cache_control`  | (on blocks, tools, the body) a prompt-cache hint: out of the key, forwarded. Claude Code moves it to the last message each turn |

Validation is never stricter than the API: a role (Claude Code sends `{"role": "system"}`
messages under a mid-conversation-system beta), block type or member the gateway does not
know is forwarded and keyed exactly as sent. Only what the key and the answer's rendering
read is checked: `model`, `max_tokens`, `messages` as a list of objects with a string role
and string-or-blocks content, `stream`, and the sampling parameters the policy rewrites.

The `anthropic-version` and `anthropic-beta` headers are part of the key: a missing
version is the one the gateway sends (ANTHROPIC_VERSION), and the beta list is a set.

The stream: `message_start`, then for each content block `content_block_start`, its
`content_block_delta`s and `content_block_stop`, then `message_delta` (stop reason and
cumulative usage) and `message_stop`, each with its `event:` line. An answer is complete
at `message_stop` with a stop reason. `ping` events are keep-alives: neither recorded
nor passed on, so a live stream and its replays are the same bytes. `message_stop` is
sent only once the answer is known to be complete, so a reader that saw it got an answer
the cache holds; an `error` event or a stream cut short is passed on and never stored.
A whole answer's stream is synthesized deterministically: one delta per block.
"""
from __future__ import annotations

from typing import Annotated, Any, Iterator

import orjson
from pydantic import Field, StrictBool, StrictInt, StrictStr, TypeAdapter

from gateway.apis.surface import NotAnAnswer, Recorder, Surface, View, as_dict, as_list
from gateway.apis.validation import Number, Open
from gateway.cache.entry import Entry
from gateway.errors import ANTHROPIC_ERRORS, UpstreamError
from gateway.policy import canonical as c
from gateway.strategies.schema_check import (
    SchemaError,
    call_feedback,
    check_content,
    content_feedback,
    validate,
)
from gateway.strategies.vote import tool_calls_text
from gateway.upstream.sse import frame

# Sent when the client names none: the API refuses a request without one.
ANTHROPIC_VERSION = "2023-06-01"


class Block(Open):
    type: StrictStr


class Message(Open):
    role: StrictStr
    content: StrictStr | list[Block]


class Tool(Open):
    name: Annotated[StrictStr, Field(min_length=1)]


class Typed(Open):
    type: StrictStr


class MessagesRequest(Open):
    model: Annotated[StrictStr, Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=0)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: StrictStr | list[Block] | None = None
    stream: StrictBool | None = None
    temperature: Annotated[Number, Field(ge=0, le=1)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None
    stop_sequences: list[StrictStr] | None = None
    tools: list[Tool] | None = None
    tool_choice: Typed | None = None
    thinking: Typed | None = None
    metadata: Open | None = None


_REQUEST = TypeAdapter(MessagesRequest)
# Fields a message_delta carries and message_start announces as null.
_DELTA_FIELDS = ("stop_reason", "stop_sequence", "stop_details")
_STOP_PAYLOAD = b'{"type":"message_stop"}'
# The finish class of a stop reason (Entry.finish), by which the store rules decide (gateway/cache/storing.py).
_FINISH = {"max_tokens": "length", "model_context_window_exceeded": "length", "refusal": "content_filter"}
# The status an error event stands for, so that a client's SDK raises (and retries) as if
# the upstream had answered with it.
_ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                 "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
                 "api_error": 500, "overloaded_error": 529}


# ---- canonical form

def _content(value: Any, trace: c.Trace) -> Any:
    """A message's content (and `system`, and a tool result's, which nests it): a string, or blocks."""
    return _blocks(value, trace)


# The blocks whose members the gateway knows; any other (image, document, thinking,
# redacted_thinking, server tool blocks) is kept exactly as sent.
_BLOCKS: dict[str, c.Fields] = {
    "text": c.Fields({"type": c.plain, "text": c.text_field, "cache_control": c.unkeyed, "citations": c.plain}),
    "tool_use": c.Fields({"type": c.plain, "id": c.plain, "name": c.plain, "input": c.verbatim,
                          "cache_control": c.unkeyed}),
    # What a tool returned is data (a file the agent read): sent and keyed byte for byte.
    "tool_result": c.Fields({"type": c.plain, "tool_use_id": c.plain, "content": c.as_data(_content),
                             "is_error": c.plain, "cache_control": c.unkeyed}),
}
_blocks = c.content_of(c.by_type(_BLOCKS))
_MESSAGE = c.Fields({"role": c.plain, "content": _content})
_TOOL = c.Fields({"type": c.plain, "name": c.plain, "description": c.text_field, "input_schema": c.verbatim,
                  "cache_control": c.unkeyed}, nullable=frozenset({"description", "cache_control"}))


def _tool(tool: Any, trace: c.Trace) -> Any:
    """A client tool (no type, or "custom"); a server tool is the provider's own object, kept as sent."""
    if isinstance(tool, dict) and tool.get("type", "custom") == "custom":
        return c.known(tool, _TOOL, trace)
    return c.verbatim(tool)


_FORMAT = c.Fields({"type": c.plain, "schema": c.verbatim})
_BODY = c.Fields(
    {"model": c.plain, "max_tokens": c.plain, "messages": c.each(c.of(_MESSAGE)), "system": _content,
     "temperature": c.number, "top_p": c.number, "top_k": c.plain, "stop_sequences": c.plain,
     "tools": c.each(_tool), "tool_choice": c.plain, "thinking": c.plain,
     "output_config": c.of(c.Fields({"effort": c.plain, "format": c.of(_FORMAT)})),
     "output_format": c.of(_FORMAT)},
    nullable=frozenset({"output_config", "output_format", "stop_sequences", "system", "temperature", "thinking",
                        "tool_choice", "tools", "top_k", "top_p"}),
)
_UNKEYED = frozenset({"stream", "metadata", "service_tier", "cache_control"})


# ---- answers: body <-> stream

def _event(event: dict) -> bytes:
    return frame(orjson.dumps(event), event["type"])


STOP_FRAME = frame(_STOP_PAYLOAD, "message_stop")


def _opened(block: dict) -> tuple[dict, list[dict]]:
    """(what content_block_start announces, the deltas that complete it) for one whole block."""
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        start = {**block, "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
        if isinstance(block.get("citations"), list):
            start["citations"] = []
            deltas += [{"type": "citations_delta", "citation": cite} for cite in block["citations"]]
        return start, deltas
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}] if block["thinking"] else []
        if isinstance(block.get("signature"), str):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {**block, "thinking": "", "signature": ""}, deltas
    if isinstance(block.get("input"), dict):  # tool_use and the server-side tool uses
        arguments = orjson.dumps(block["input"]).decode()
        return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": arguments}]
    return block, []


def _synthesized(message: dict) -> bytes:
    """The stream a whole Message stands for, without its message_stop."""
    start = {**message, "content": []}
    for name in _DELTA_FIELDS:
        if name in start:
            start[name] = None
    out = [_event({"type": "message_start", "message": start})]
    for index, block in enumerate(as_list(message.get("content"))):
        opened, deltas = _opened(as_dict(block))
        out.append(_event({"type": "content_block_start", "index": index, "content_block": opened}))
        out += [_event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        out.append(_event({"type": "content_block_stop", "index": index}))
    delta = {name: message.get(name) for name in _DELTA_FIELDS if name in message}
    out.append(_event({"type": "message_delta", "delta": delta, "usage": as_dict(message.get("usage"))}))
    return b"".join(out)


def _apply(block: dict, delta: dict, json_parts: list[str]) -> None:
    """Adds one content_block_delta to its block: text and thinking are appended, tool input
    JSON is collected (parsed at the block's end), citations are listed, a signature is set."""
    kind = delta.get("type")
    if kind == "input_json_delta":
        json_parts.append(str(delta.get("partial_json") or ""))
    elif kind == "citations_delta":
        block["citations"] = as_list(block.get("citations")) + [delta.get("citation")]
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature")
    else:
        for name, value in delta.items():
            if name != "type" and isinstance(value, str):
                have = block.get(name)
                block[name] = (have if isinstance(have, str) else "") + value
            elif name != "type":
                block[name] = value


def _error_status(event: dict) -> int:
    return _ERROR_STATUS.get(as_dict(event.get("error")).get("type"), 502)


def _finish(upstream: str, message: Any, payload: bytes) -> str:
    """The entry's finish class of a complete Message; raises for anything else."""
    if not isinstance(message, dict):
        raise NotAnAnswer(upstream, "not a JSON object")
    if message.get("type") == "error":
        raise UpstreamError(_error_status(message), payload)  # an error with a 200: passed on as worded
    if message.get("type") != "message" or not isinstance(message.get("content"), list):
        raise NotAnAnswer(upstream, "not a message with content")
    reason = message.get("stop_reason")
    if not isinstance(reason, str):
        raise NotAnAnswer(upstream, "no stop_reason")
    return _FINISH.get(reason, "stop")


class MessagesRecorder(Recorder):
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.frames: list[bytes] = []
        self.message: dict | None = None
        self.blocks: dict[int, dict] = {}
        self.inputs: dict[int, list[str]] = {}  # tool input JSON pieces, by block
        self.done = False

    def push(self, payload: bytes) -> bytes | None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError.broken_stream(self.upstream, f"an event that is not JSON ({exc})") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise UpstreamError.broken_stream(self.upstream, "an event that is not a typed JSON object")
        kind = event["type"]
        if kind == "ping":
            return None
        if kind == "error":
            raise UpstreamError(_error_status(event), payload)
        if kind == "message_stop":
            self.done = True
            return None  # sent by stream_end, once the answer is known complete
        if kind == "message_start":
            self.message = dict(as_dict(event.get("message")))
            self.model = str(self.message.get("model") or "")
        elif self.message is None:
            raise UpstreamError.broken_stream(self.upstream, f"{kind} before message_start")
        elif kind == "content_block_start":
            self.blocks[self._index(event, kind)] = dict(as_dict(event.get("content_block")))
        elif kind == "content_block_delta":
            index = self._index(event, kind)
            if index not in self.blocks:
                raise UpstreamError.broken_stream(self.upstream, f"a delta for content block {index}, never started")
            _apply(self.blocks[index], as_dict(event.get("delta")), self.inputs.setdefault(index, []))
        elif kind == "content_block_stop":
            self._settle(self._index(event, kind))
        elif kind == "message_delta":
            self.message.update(as_dict(event.get("delta")))
            usage = self.message["usage"] = dict(as_dict(self.message.get("usage")))
            usage.update({k: v for k, v in as_dict(event.get("usage")).items() if v is not None})
        # An event whose JSON spans several data: lines is sent on one, as every other is.
        out = frame(orjson.dumps(event) if b"\n" in payload else payload, kind)
        self.frames.append(out)
        return out

    def _index(self, event: dict, kind: str) -> int:
        index = event.get("index")
        if type(index) is not int:
            raise UpstreamError.broken_stream(self.upstream, f"a {kind} event without a content block index")
        return index

    def _settle(self, index: int) -> None:
        """A tool input's JSON, whole once its block has ended."""
        parts = self.inputs.pop(index, None)
        if parts and "".join(parts):
            try:
                self.blocks[index]["input"] = orjson.loads("".join(parts))
            except orjson.JSONDecodeError:
                raise NotAnAnswer(self.upstream, f"content block {index} has tool input that is not JSON") from None

    def finish(self) -> Entry:
        if not self.done or self.message is None:
            raise UpstreamError.broken_stream(self.upstream, "the stream ended before message_stop")
        for index in list(self.inputs):
            self._settle(index)
        body = {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}
        payload = orjson.dumps(body)
        finish = _finish(self.upstream, body, payload)
        return Entry(payload, b"".join(self.frames), str(body.get("model") or ""), finish)


# ---- the surface

def _tool_uses(response: dict) -> list[tuple[int, dict]]:
    return [(i, b) for i, b in enumerate(as_list(response.get("content"))) if as_dict(b).get("type") == "tool_use"]


def _text(response: dict) -> str:
    return "".join(b["text"] for b in map(as_dict, as_list(response.get("content")))
                   if b.get("type") == "text" and isinstance(b.get("text"), str))


class AnthropicMessages(Surface):
    name = "messages"
    path = "/messages"
    wire = "anthropic"
    errors = ANTHROPIC_ERRORS
    # No seed and no n: a vote's voters are the same request, varied by the provider alone.
    sampling = frozenset({"temperature", "top_p", "top_k"})
    keyed_headers = ("anthropic-version", "anthropic-beta")
    resent_members = frozenset({"tool_use_id"})
    checks_schemas = True
    request = _REQUEST
    fields = _BODY
    unkeyed = _UNKEYED
    # The Message echoes no request field (its usage.service_tier reports the tier that
    # answered, in words of its own), so nothing is rewritten per reader; a container it
    # names is recorded for the tenant it is served to.
    names_state = True

    def uncached(self, body: dict) -> str | None:
        if body.get("container") is not None:
            return "a container holds upstream state (files a tool made) that no key can name"
        return None

    def state_ids(self, body: dict) -> list[tuple[str, str]]:
        container = body.get("container")
        found: list[tuple[str, Any]] = [("container", as_dict(container).get("id") if isinstance(container, dict)
                                         else container)]
        for i, message in enumerate(map(as_dict, as_list(body.get("messages")))):
            for j, block in enumerate(map(as_dict, as_list(message.get("content")))):
                source = as_dict(block.get("source"))
                if source.get("type") == "file":
                    found.append((f"messages[{i}].content[{j}].source.file_id", source.get("file_id")))
                if block.get("type") == "container_upload":
                    found.append((f"messages[{i}].content[{j}].file_id", block.get("file_id")))
        return [(param, named) for param, named in found if isinstance(named, str) and named]

    def refuses(self, body: dict) -> frozenset[str]:
        # Thinking takes temperature 1 only (sent as none), top_p from 0.95 (none means 1), no top_k.
        if as_dict(body.get("thinking")).get("type") in ("enabled", "adaptive"):
            return self.sampling
        return frozenset()

    def keyed(self, sent: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        headers = dict(sent)
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
        if "anthropic-beta" in headers:
            betas = sorted({b.strip() for b in headers["anthropic-beta"].split(",") if b.strip()})
            headers["anthropic-beta"] = ",".join(betas)
            if not betas:
                del headers["anthropic-beta"]
        return tuple((name, headers[name]) for name in self.keyed_headers if name in headers)

    def message_count(self, body: dict) -> int:
        return len(body.get("messages") or ())

    def texts(self, body: dict) -> Iterator[tuple[str, str]]:
        system = body.get("system")
        if isinstance(system, str):
            yield "system", system
        for j, block in enumerate(as_list(system)):
            if isinstance(as_dict(block).get("text"), str):
                yield f"system[{j}].text", block["text"]
        for i, message in enumerate(as_list(body.get("messages"))):
            content = as_dict(message).get("content")
            if isinstance(content, str):
                yield f"messages[{i}].content", content
            for j, block in enumerate(as_list(content)):
                if as_dict(block).get("type") == "text" and isinstance(block.get("text"), str):
                    yield f"messages[{i}].content[{j}].text", block["text"]

    def from_body(self, upstream: str, payload: bytes) -> Entry:
        parsed = orjson.loads(payload)
        finish = _finish(upstream, parsed, payload)
        return Entry(payload, _synthesized(parsed), str(parsed.get("model") or ""), finish)

    def recorder(self, upstream: str) -> Recorder:
        return MessagesRecorder(upstream)

    def render(self, entry: Entry, view: View) -> bytes:
        if not view.stream or entry.stream is None:
            return entry.body
        return entry.stream + STOP_FRAME

    def stream_end(self, entry: Entry, view: View) -> bytes:
        return STOP_FRAME

    def named_ids(self, body: bytes) -> list[str]:
        try:
            container = as_dict(as_dict(orjson.loads(body)).get("container")).get("id")
        except orjson.JSONDecodeError:
            return []
        return [container] if isinstance(container, str) and container else []

    def answer_parts(self, parsed: dict) -> list:
        blocks = [{k: v for k, v in as_dict(b).items() if k not in ("id", "signature")}
                  for b in as_list(parsed.get("content"))]
        return [{"content": blocks, "stop_reason": parsed.get("stop_reason")}]

    def answer_text(self, response: dict) -> str:
        """The tool uses as canonical JSON when there are any, else the text blocks joined."""
        uses = _tool_uses(response)
        if uses:
            return tool_calls_text((b.get("name"), b.get("input")) for _, b in uses)
        return _text(response)

    def requested_schema(self, body: dict) -> tuple[str, dict] | None:
        for param, spec in (("output_config.format", as_dict(as_dict(body.get("output_config")).get("format"))),
                            ("output_format", as_dict(body.get("output_format")))):
            if spec.get("type") == "json_schema" and isinstance(spec.get("schema"), dict):
                return f"{param}.schema", spec["schema"]
        return None

    def tool_schemas(self, body: dict) -> list[tuple[str, Any]]:
        return [(f"tools[{i}].input_schema", tool["input_schema"]) for i, tool in enumerate(as_list(body.get("tools")))
                if "input_schema" in as_dict(tool)]

    def problems(self, response: dict, request: dict, schema: dict | None) -> list[SchemaError]:
        if not isinstance(response.get("content"), list):
            return [SchemaError("$", "", "the response has no content")]
        offered = {t["name"]: t.get("input_schema", {}) for t in map(as_dict, as_list(request.get("tools")))
                   if "input_schema" in t and isinstance(t.get("name"), str)}
        uses = _tool_uses(response)
        errors: list[SchemaError] = []
        for i, block in uses:
            name = block.get("name")
            if name not in offered:
                errors.append(SchemaError(f"$.content[{i}].name", "",
                                          f"{name!r} is not one of the offered tools {sorted(offered)}"))
            else:
                errors += validate(block.get("input"), offered[name], f"$.content[{i}].input")
        if not uses and schema is not None:
            errors += check_content(_text(response), schema)
        return errors

    def with_feedback(self, request: dict, response: dict, errors: list[SchemaError]) -> dict | None:
        """The conversation so far, the failed answer as it was (thinking and signatures
        included, as the API requires), then a user turn: an error tool_result for every tool
        use (each must be answered), or the errors in words."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        assistant = {"role": "assistant", "content": as_list(response.get("content"))}
        uses = _tool_uses(response)
        if uses:
            content: Any = [{"type": "tool_result", "tool_use_id": b.get("id", ""), "is_error": True,
                             "content": call_feedback(errors, f"$.content[{i}]")} for i, b in uses]
        else:
            content = content_feedback(errors)
        return {**request, "messages": [*messages, assistant, {"role": "user", "content": content}]}


SURFACE = AnthropicMessages()
