"""OpenAI Responses (`POST /v1/responses`): items in, a response object out.

The key holds what the model reads and how it samples: `input` (a string, or items:
messages, function calls and their outputs, reasoning items), `instructions`, `tools`,
`text.format`, `reasoning`, `temperature` / `top_p`, `max_output_tokens`, `truncation`,
`include`, `previous_response_id`. `metadata`, `store`, `user` and the other fields that
cannot change the answer are forwarded, not keyed. The wire has no `seed`, so none is
keyed or sent; a vote's voters differ by the upstream's own sampling.

Text rules apply to message text (string content, `input_text` / `output_text` /
`refusal` parts), `instructions`, and tool and format descriptions. Kept as sent:
function-call outputs and every other tool output (data: a file the agent read reaches the
model byte for byte), function-call arguments, reasoning items (their `encrypted_content`
is opaque), built-in tools, JSON schemas (key order is meaning).

Bookkeeping a client makes up is forwarded but not keyed: `client_metadata` (Codex's
session, turn and installation ids, the turn's start time) and the `id` of a message,
function call or function-call output in `input` (Codex mints a UUIDv7 for each). Ids that
name state or pair things stay keyed: `call_id` (a call with its output), reasoning items
(their id names stored reasoning), `item_reference`, `previous_response_id`.

Validation is never stricter than the API: an item's role, type or member the gateway does
not know is forwarded and keyed as sent; only what the key, chains and rendering read is
checked.

Shapes unified: a content list of one plain `input_text` part is its text, and an
`input` of one user message holding only text is that text, as the API defines both.

State the upstream keeps: `previous_response_id` continues an answer, which the core
resolves through the ids it served (`parent_id` / `answer_id`). `conversation` changes
with every turn and `background` answers later, so both pass through uncached, as does a
`prompt` template without a pinned `version` (its latest version can change). Every id of
upstream state a request names (`state_ids`: a conversation, item references, files,
vector stores, containers) must be one its tenant was served or made (`named_ids`: a
response's output items and conversation), and a `store: false` answer, whose id names
nothing upstream, is kept apart from `store: true` ones (`apart`).

The response object echoes `metadata`, `user`, `safety_identifier`, `prompt_cache_key`,
`prompt_cache_retention`, `store` and `service_tier`: each reader is shown its own.
"""
from __future__ import annotations

from typing import Annotated, Any, Iterator

import orjson
from pydantic import (
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    model_validator,
)

from gateway.apis import response_events as events
from gateway.apis.surface import Recorder, Surface, View, as_dict, as_list
from gateway.apis.validation import Number, Open
from gateway.cache.entry import Entry
from gateway.errors import ApiError, UpstreamError
from gateway.policy import canonical as c
from gateway.policy.canonical import Fields
from gateway.strategies.schema_check import (
    JSON_OBJECT,
    SchemaError,
    call_feedback,
    check_calls,
    check_content,
    content_feedback,
)
from gateway.strategies.vote import tool_calls_text


class Part(Open):
    type: StrictStr


class Item(Open):
    type: StrictStr | None = None
    role: StrictStr | None = None
    content: StrictStr | list[Part] | None = None

    @model_validator(mode="after")
    def _kind(self) -> Item:
        if self.type is None and self.role is None:
            raise ValueError("an input item needs a type or a role")
        return self


class Tool(Open):
    type: StrictStr
    name: Annotated[StrictStr, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _named(self) -> Tool:
        if self.type == "function" and self.name is None:
            raise ValueError("a function tool needs a name")
        return self


class Format(Open):
    type: StrictStr


class TextConfig(Open):
    format: Format | None = None


class Named(Open):
    id: Annotated[StrictStr, Field(min_length=1)]


class ResponsesRequest(Open):
    model: Annotated[StrictStr, Field(min_length=1)]
    # The list first: its errors name the item at fault, where the string's could only say "input".
    input: list[Item] | StrictStr | None = None
    instructions: StrictStr | None = None
    stream: StrictBool | None = None
    background: StrictBool | None = None
    store: StrictBool | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    previous_response_id: Annotated[StrictStr, Field(min_length=1)] | None = None
    conversation: Annotated[StrictStr, Field(min_length=1)] | Named | None = None
    prompt: Named | None = None
    tools: list[Tool] | None = None
    text: TextConfig | None = None
    include: list[StrictStr] | None = None


_REQUEST = TypeAdapter(ResponsesRequest)

_TEXT_PART = Fields({"type": c.plain, "text": c.text_field})
# The content parts an input message may hold; a part of another type is kept as sent.
_PART = c.by_type({
    "input_text": _TEXT_PART,
    "output_text": Fields({"type": c.plain, "text": c.text_field, "annotations": c.plain, "logprobs": c.plain}),
    "refusal": Fields({"type": c.plain, "refusal": c.text_field}),
    "input_image": Fields({"type": c.plain, "image_url": c.plain, "file_id": c.plain, "detail": c.plain},
                          nullable=frozenset({"image_url", "file_id", "detail"}), defaults={"detail": "auto"}),
    "input_file": Fields({"type": c.plain, "file_id": c.plain, "file_data": c.plain, "file_url": c.plain,
                          "filename": c.plain}, nullable=frozenset({"file_id", "file_data", "file_url", "filename"})),
})


# A message's content, or a function call's output: a string, or a list of parts.
_content = c.content_of(_PART, "input_text")


# A tool's answer to one call: paired with the call by `call_id`; its output is data.
def _call_output(output: c.FieldRule) -> Fields:
    return Fields({"type": c.plain, "call_id": c.plain, "output": c.as_data(output), "id": c.unkeyed,
                   "status": c.plain})


# The input items the gateway reads; reasoning items (their encrypted_content is opaque,
# their id may name stored reasoning), item references and items of other types are kept
# exactly as sent. The `id` an item carries is the client's bookkeeping (Codex mints one for
# every item it sends) or the upstream's name for an output item echoed back: the model
# reads neither, so neither is keyed.
_ITEMS: dict[str, Fields] = {
    "message": Fields({"type": c.plain, "role": c.plain, "content": _content, "id": c.unkeyed, "status": c.plain,
                       "phase": c.plain}),
    "function_call": Fields({"type": c.plain, "call_id": c.plain, "name": c.plain, "arguments": c.plain,
                             "id": c.unkeyed, "status": c.plain}),
    "custom_tool_call": Fields({"type": c.plain, "call_id": c.plain, "name": c.plain, "input": c.plain,
                                "id": c.unkeyed, "status": c.plain}),
    "function_call_output": _call_output(_content),
    "custom_tool_call_output": _call_output(_content),
    "local_shell_call_output": _call_output(c.verbatim),
    # Codex's tools travel as an input item; the tools themselves are kept as sent.
    "additional_tools": Fields({"type": c.plain, "role": c.plain, "tools": c.verbatim, "id": c.unkeyed}),
}


def _item(value: Any, trace: c.Trace) -> Any:
    # A message may leave its type out: {"role": "user", "content": "..."}.
    kind = value.get("type", "message" if "role" in value else None) if isinstance(value, dict) else None
    fields = _ITEMS.get(kind) if isinstance(kind, str) else None
    return c.known(value, fields, trace) if fields is not None else c.verbatim(value)


def _is_user_text(item: Any) -> bool:
    return (isinstance(item, dict) and item.keys() <= {"type", "role", "content"} and item.get("role") == "user"
            and item.get("type", "message") == "message" and isinstance(item.get("content"), str))


def _input(value: Any, trace: c.Trace) -> Any:
    """A string, or a list of items; one user message of text alone is that text."""
    if not isinstance(value, list):
        return c.text_field(value, trace)
    items = [_item(item, trace) for item in value]
    if len(items) == 1 and _is_user_text(items[0]):
        trace.append("input_shape")
        return items[0]["content"]
    return items


# A function tool is flat here ({"type": "function", "name", "parameters", ...}); built-in tools are kept as sent.
_FUNCTION_TOOL = Fields({"type": c.plain, "name": c.plain, "description": c.text_field, "parameters": c.verbatim,
                         "strict": c.plain}, nullable=frozenset({"description", "parameters", "strict"}))
_FORMAT = c.by_type({
    "text": Fields({"type": c.plain}), "json_object": Fields({"type": c.plain}),
    "json_schema": Fields({"type": c.plain, "name": c.plain, "description": c.text_field, "schema": c.verbatim,
                           "strict": c.plain}, nullable=frozenset({"description", "strict"})),
})
_TEXT = Fields({"format": _FORMAT, "verbosity": c.plain}, nullable=frozenset({"format", "verbosity"}),
               defaults={"format": {"type": "text"}})

# The request body as the gateway knows it (see canonical.py); a member not listed is kept
# exactly as sent. Null means absent for every optional member listed.
_FIELDS = Fields(
    {"model": c.plain, "input": _input, "instructions": c.text_field, "temperature": c.number, "top_p": c.number,
     "max_output_tokens": c.plain, "max_tool_calls": c.plain, "parallel_tool_calls": c.plain,
     "previous_response_id": c.plain, "conversation": c.plain, "background": c.plain, "prompt": c.plain,
     "reasoning": c.plain, "text": c.of(_TEXT), "tool_choice": c.plain,
     "tools": c.each(c.by_type({"function": _FUNCTION_TOOL})), "top_logprobs": c.plain, "truncation": c.plain,
     "include": c.plain},
    nullable=frozenset({
        "input", "instructions", "temperature", "top_p", "max_output_tokens", "max_tool_calls", "parallel_tool_calls",
        "previous_response_id", "conversation", "background", "prompt", "reasoning", "text", "tool_choice", "tools",
        "top_logprobs", "truncation", "include",
    }),
    # Documented defaults, the same on every server that speaks Responses.
    defaults={"background": False, "truncation": "disabled", "text": {}, "include": []},
)


def _output_text(response: dict) -> str:
    return "".join(part["text"] for item in as_list(response.get("output")) if as_dict(item).get("type") == "message"
                   for part in map(as_dict, as_list(item.get("content")))
                   if part.get("type") == "output_text" and isinstance(part.get("text"), str))


def _calls(response: dict) -> list[tuple[int, dict]]:
    return [(i, item) for i, item in enumerate(map(as_dict, as_list(response.get("output"))))
            if item.get("type") == "function_call"]


class Responses(Surface):
    name = "responses"
    path = "/responses"
    sampling = frozenset({"temperature", "top_p"})
    checks_schemas = True
    chains = True
    names_state = True
    request = _REQUEST
    fields = _FIELDS
    echoed = {"metadata": {}, "user": None, "safety_identifier": None, "prompt_cache_key": None,
              "prompt_cache_retention": None, "store": True, "service_tier": "default"}
    echo_object = "response"
    unkeyed = c.UNKEYED_FIELDS | {"client_metadata"}
    resent_members = frozenset({"call_id", "previous_response_id"})

    def validate(self, body: Any) -> None:
        super().validate(body)
        if body.get("previous_response_id") is not None and body.get("conversation") is not None:
            raise ApiError(400, "previous_response_id and conversation cannot both be set: each names the "
                                "conversation so far.", param="conversation", code="invalid_value")

    def upstream_body(self, sent: dict, stream: bool) -> dict:
        out = {k: v for k, v in sent.items() if k not in ("stream", "stream_options")}
        if stream:
            out["stream"] = True
            if "stream_options" in sent:
                out["stream_options"] = sent["stream_options"]
        return out

    def uncached(self, body: dict) -> str | None:
        if body.get("background") is True:
            return "background: true is answered later, by polling"
        if body.get("conversation") is not None:
            return "a conversation changes with every turn the upstream adds to it"
        prompt = body.get("prompt")
        if isinstance(prompt, dict) and prompt.get("version") is None:
            return "a prompt template without a version follows its latest one, which can change (pin a version)"
        return None

    def parent_id(self, body: dict) -> str | None:
        parent = body.get("previous_response_id")
        return parent if isinstance(parent, str) else None

    def state_ids(self, body: dict) -> list[tuple[str, str]]:
        found: list[tuple[str, Any]] = []
        conversation = body.get("conversation")
        found.append(("conversation", as_dict(conversation).get("id") if isinstance(conversation, dict) else conversation))
        for i, item in enumerate(map(as_dict, as_list(body.get("input")))):
            if item.get("type") == "item_reference":
                found.append((f"input[{i}].id", item.get("id")))
            for j, part in enumerate(map(as_dict, as_list(item.get("content")))):
                found.append((f"input[{i}].content[{j}].file_id", part.get("file_id")))
        for i, tool in enumerate(map(as_dict, as_list(body.get("tools")))):
            found += [(f"tools[{i}].vector_store_ids", store) for store in as_list(tool.get("vector_store_ids"))]
            container = tool.get("container")
            if isinstance(container, str):
                found.append((f"tools[{i}].container", container))
            found += [(f"tools[{i}].container.file_ids", file) for file in as_list(as_dict(container).get("file_ids"))]
        return [(param, named) for param, named in found if isinstance(named, str) and named]

    def apart(self, body: dict) -> str:
        # A `store: false` answer's id names nothing the upstream keeps: served to a
        # `store: true` asker, its next turn would fail upstream.
        return "unstored" if body.get("store") is False else ""

    def resent(self, name: str | None, value: Any) -> bool:
        # The model's own output items sent back: its tool calls (every "*_call") and reasoning.
        kind = value.get("type") if isinstance(value, dict) else None
        return super().resent(name, value) or (isinstance(kind, str) and (kind.endswith("_call") or kind == "reasoning"))

    def message_count(self, body: dict) -> int:
        value = body.get("input")
        return len(value) if isinstance(value, list) else int(isinstance(value, str))

    def texts(self, body: dict) -> Iterator[tuple[str, str]]:
        for name in ("instructions", "input"):
            if isinstance(body.get(name), str):
                yield name, body[name]
        for i, item in enumerate(as_list(body.get("input"))):
            content = as_dict(item).get("content")
            if isinstance(content, str):
                yield f"input[{i}].content", content
            for j, part in enumerate(map(as_dict, as_list(content))):
                if isinstance(part.get("text"), str):
                    yield f"input[{i}].content[{j}].text", part["text"]

    # ---- the answer

    def from_body(self, upstream: str, payload: bytes) -> Entry:
        response = events.check(upstream, orjson.loads(payload), payload)
        stream, end = events.synthesized(response)
        return Entry(payload, stream, str(response.get("model") or ""), "stop", end)

    def recorder(self, upstream: str) -> Recorder:
        return events.EventRecorder(upstream)

    def render(self, entry: Entry, view: View) -> bytes:
        if view.stream:
            return self.echo_stream(entry.stream, view) + self.stream_end(entry, view)
        return self.echo_body(entry.body, view)

    def stream_end(self, entry: Entry, view: View) -> bytes:
        return self.echo_frame(entry.tail, view)

    def passed_on(self, payload: bytes, view: View) -> tuple[bytes, str]:
        # A stream's reader whose flight fetched the answer whole (it joined a body's
        # request) is sent it as a stream all the same, ending in its own terminal event.
        if not view.stream:
            return self.echo_body(payload, view), "application/json"
        stream, end = events.synthesized(orjson.loads(payload))
        return self.echo_stream(stream, view) + self.echo_frame(end, view), "text/event-stream"

    def in_band_error(self, exc: UpstreamError) -> bytes:
        if isinstance(exc, events.Unfinished):
            return b""  # its own terminal event has gone out live
        if isinstance(exc, events.ErrorEvent):
            return exc.event
        return events.error_frame(exc)

    def answer_id(self, body: bytes) -> str | None:
        try:
            found = as_dict(orjson.loads(body)).get("id")
        except orjson.JSONDecodeError:
            return None
        return found if isinstance(found, str) and found else None

    def named_ids(self, body: bytes) -> list[str]:
        try:
            response = as_dict(orjson.loads(body))
        except orjson.JSONDecodeError:
            return []
        named = [as_dict(item).get("id") for item in as_list(response.get("output"))]
        conversation = response.get("conversation")
        named.append(as_dict(conversation).get("id") if isinstance(conversation, dict) else conversation)
        return [one for one in named if isinstance(one, str) and one]

    def answer_parts(self, parsed: dict) -> list:
        parts = []
        for item in map(as_dict, as_list(parsed.get("output"))):
            if item.get("type") == "message":
                parts.append({"content": [{k: v for k, v in as_dict(p).items() if k != "logprobs"}
                                          for p in as_list(item.get("content"))]})
            elif item.get("type") == "function_call":
                parts.append({"name": item.get("name"), "arguments": item.get("arguments")})
            else:
                parts.append({"type": item.get("type")})
        return parts

    # ---- strategies

    def answer_text(self, response: dict) -> str:
        """The output text, or the function calls as canonical JSON (arguments parsed
        where they are JSON)."""
        calls = _calls(response)
        if not calls:
            return _output_text(response)
        return tool_calls_text((call.get("name"), call.get("arguments", "")) for _, call in calls)

    def requested_schema(self, body: dict) -> tuple[str, dict] | None:
        form = as_dict(as_dict(body.get("text")).get("format"))
        if form.get("type") == "json_object":
            return "text.format", JSON_OBJECT
        if form.get("type") == "json_schema":
            return "text.format.schema", form.get("schema", {})
        return None

    def tool_schemas(self, body: dict) -> list[tuple[str, Any]]:
        return [(f"tools[{i}].parameters", tool.get("parameters", {}))
                for i, tool in enumerate(map(as_dict, as_list(body.get("tools")))) if tool.get("type") == "function"]

    def problems(self, response: dict, request: dict, schema: dict | None) -> list[SchemaError]:
        if not as_list(response.get("output")):
            return [SchemaError("$", "", "the response has no output")]
        calls = _calls(response)
        if calls:
            parameters = {tool["name"]: tool.get("parameters", {}) for tool in map(as_dict, as_list(request.get("tools")))
                          if tool.get("type") == "function" and "name" in tool}
            return check_calls([(f"output[{i}]", call.get("name"), call.get("arguments")) for i, call in calls],
                               parameters)
        return check_content(_output_text(response), schema) if schema is not None else []

    def with_feedback(self, request: dict, response: dict, errors: list[SchemaError]) -> dict | None:
        """The input so far, the failed answer, then the errors addressed to the model (an
        output for every function call, as the API requires each call answered); None for a
        request whose answer the upstream keeps (`store`, the default): the retry's id would
        name a history holding the rejected answer and the feedback, which its client never
        saw, so such a retry asks again as the client asked."""
        if request.get("store") is not False:
            return None
        given = request.get("input")
        so_far = [{"role": "user", "content": given}] if isinstance(given, str) else list(as_list(given))
        calls = _calls(response)
        if calls:
            turn = []
            for i, call in calls:
                turn.append({k: call[k] for k in ("type", "call_id", "name", "arguments") if k in call})
                turn.append({"type": "function_call_output", "call_id": call.get("call_id", ""),
                             "output": call_feedback(errors, f"output[{i}]")})
        else:
            turn = [{"role": "assistant", "content": _output_text(response)},
                    {"role": "user", "content": content_feedback(errors)}]
        return {**request, "input": [*so_far, *turn]}


SURFACE = Responses()
