"""OpenAI Chat Completions (`POST /v1/chat/completions`), and every provider that speaks it."""
from __future__ import annotations

from typing import Annotated, Any, Iterator, Literal

import orjson
from pydantic import Field, StrictInt, StrictStr, TypeAdapter

from gateway.apis import choices
from gateway.apis.surface import Recorder, as_dict, as_list
from gateway.apis.validation import Open, Sampling
from gateway.cache.entry import Entry
from gateway.policy import canonical as c
from gateway.strategies.schema_check import (
    JSON_OBJECT,
    SchemaError,
    call_feedback,
    check_calls,
    check_content,
    content_feedback,
)
from gateway.strategies.vote import tool_calls_text
from gateway.upstream.sse import frame


class ContentPart(Open):
    type: StrictStr


class Message(Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[ContentPart] | None = None


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None


_REQUEST = TypeAdapter(ChatRequest)

# The request body as the gateway knows it (see canonical.py): every member OpenAI defines,
# and top_k, which the profiles know. A member not listed is kept exactly as sent. Null
# means absent for every optional member listed; an unknown member's null may mean
# something to the provider that defined it.
_FIELDS = c.Fields(
    {"model": c.plain, "messages": c.messages, "audio": c.plain, "frequency_penalty": c.number,
     "function_call": c.plain, "functions": c.functions, "logit_bias": c.numbers, "logprobs": c.plain,
     "max_completion_tokens": c.plain, "max_tokens": c.plain, "modalities": c.plain, "moderation": c.plain,
     "n": c.plain, "parallel_tool_calls": c.plain, "prediction": c.plain, "presence_penalty": c.number,
     "reasoning_effort": c.plain, "response_format": c.response_format, "seed": c.plain, "stop": c.stop,
     "temperature": c.number, "tool_choice": c.plain, "tools": c.tools, "top_k": c.number, "top_logprobs": c.plain,
     "top_p": c.number, "verbosity": c.plain, "web_search_options": c.plain},
    nullable=frozenset({
        "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "modalities", "moderation", "n", "parallel_tool_calls",
        "prediction", "presence_penalty", "reasoning_effort", "response_format", "seed", "stop", "temperature",
        "tool_choice", "tools", "top_k", "top_logprobs", "top_p", "verbosity", "web_search_options",
    }),
    # Documented defaults, the same on every OpenAI-compatible server.
    defaults={"n": 1, "stop": [], "logprobs": False, "frequency_penalty": 0, "presence_penalty": 0,
              "response_format": {"type": "text"}},
)


def _new_choice(index: int) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": None}, "logprobs": None, "finish_reason": None}


def _add(choice: dict[str, Any], part: dict[str, Any]) -> None:
    if isinstance(part.get("delta"), dict):
        choices.merge(choice["message"], part["delta"])
    choices.add_tail(choice, part)


def _settle(choice: dict[str, Any], last: dict[str, Any]) -> None:
    # Tool-call deltas are merged by index; a whole message's calls carry none.
    message = choice["message"]
    for call in as_list(message.get("tool_calls")):
        if isinstance(call, dict):
            call.pop("index", None)
    # An audio answer's stream ends with a delta holding only the audio's expires_at, and no
    # finish_reason (gpt-4o-audio-preview; openai-node#1206): complete audio there is a
    # finished answer. Anything else without a finish_reason stays unfinished.
    delta, audio = _present(last.get("delta")), as_dict(message.get("audio"))
    if (choice["finish_reason"] is None and set(delta) == {"audio"} and set(_present(delta["audio"])) == {"expires_at"}
            and all(audio.get(name) is not None for name in ("id", "data", "transcript", "expires_at"))):
        choice["finish_reason"] = "stop"


def _present(value: Any) -> dict:
    """An object's members that are not null."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else {}


def _chunks(parsed: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream a whole answer stands for: each choice's message in one delta, then its finish."""
    head = choices.head(parsed, "chat.completion.chunk")
    out = []
    for choice in parsed["choices"]:
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        delta = {k: v for k, v in message.items() if v is not None and k != "tool_calls"}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        index = choice.get("index", 0)
        out.append({**head, "choices": [{"index": index, "delta": delta, "logprobs": choice.get("logprobs"),
                                         "finish_reason": None}]})
        out.append({**head, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                         "finish_reason": choice.get("finish_reason")}]})
    return out


def _first_message(response: dict[str, Any]) -> dict[str, Any]:
    first = as_list(response.get("choices"))
    return as_dict(as_dict(first[0]).get("message")) if first else {}


class ChatCompletions(choices.ChoicesSurface):
    name = "chat.completions"
    path = "/chat/completions"
    checks_schemas = True
    request = _REQUEST
    fields = _FIELDS
    # The completion repeats the tier asked for (or the one that answered): each reader sees its own.
    echoed = {"service_tier": "default"}
    resent_members = frozenset({"tool_call_id"})

    def state_ids(self, body: dict) -> list[tuple[str, str]]:
        return [(f"messages[{i}].content[{j}].file.file_id", part["file"]["file_id"])
                for i, message in enumerate(map(as_dict, as_list(body.get("messages"))))
                for j, part in enumerate(map(as_dict, as_list(message.get("content"))))
                if part.get("type") == "file" and isinstance(as_dict(part.get("file")).get("file_id"), str)]

    def message_count(self, body: dict) -> int:
        return len(body.get("messages") or ())

    def texts(self, body: dict) -> Iterator[tuple[str, str]]:
        for i, message in enumerate(as_list(body.get("messages"))):
            content = as_dict(message).get("content")
            if isinstance(content, str):
                yield f"messages[{i}].content", content
            for j, part in enumerate(as_list(content)):
                if isinstance(as_dict(part).get("text"), str):
                    yield f"messages[{i}].content[{j}].text", part["text"]

    def from_body(self, upstream: str, payload: bytes) -> Entry:
        parsed = orjson.loads(payload)
        found = choices.check_answer(upstream, parsed, payload)
        stream = b"".join(frame(orjson.dumps(chunk)) for chunk in _chunks(parsed))
        return Entry(payload, stream, str(parsed.get("model") or ""), choices.finish_class(found),
                     choices.usage_frame(parsed, "chat.completion.chunk"))

    def recorder(self, upstream: str) -> Recorder:
        return choices.ChoicesRecorder(upstream, "chat.completion", "chat.completion.chunk", _add, _new_choice,
                                       _settle)

    def answer_parts(self, parsed: dict) -> list:
        parts = []
        for choice in map(as_dict, as_list(parsed.get("choices"))):
            message = as_dict(choice.get("message"))
            calls = [as_dict(as_dict(call).get("function")) for call in as_list(message.get("tool_calls"))]
            parts.append({"content": message.get("content"), "refusal": message.get("refusal"),
                          "tool_calls": [{"name": f.get("name"), "arguments": f.get("arguments")} for f in calls]})
        return parts

    def answer_text(self, response: dict) -> str:
        """The first choice's content, or its tool calls as canonical JSON (arguments
        parsed where they are JSON)."""
        message = _first_message(response)
        calls = as_list(message.get("tool_calls"))
        if calls:
            functions = [as_dict(as_dict(call).get("function")) for call in calls]
            return tool_calls_text((f.get("name"), f.get("arguments", "")) for f in functions)
        content = message.get("content")
        return content if isinstance(content, str) else ""

    def requested_schema(self, body: dict) -> tuple[str, dict] | None:
        response_format = as_dict(body.get("response_format"))
        if response_format.get("type") == "json_object":
            return "response_format", JSON_OBJECT
        spec = response_format.get("json_schema")
        if response_format.get("type") == "json_schema" and isinstance(spec, dict):
            return "response_format.json_schema.schema", spec.get("schema", {})
        return None

    def tool_schemas(self, body: dict) -> list[tuple[str, Any]]:
        out = []
        for i, tool in enumerate(as_list(body.get("tools"))):
            function = as_dict(tool).get("function") if as_dict(tool).get("type") == "function" else None
            if isinstance(function, dict):
                out.append((f"tools[{i}].function.parameters", function.get("parameters", {})))
        return out

    def problems(self, response: dict, request: dict, schema: dict | None) -> list[SchemaError]:
        found = response.get("choices")
        if not isinstance(found, list) or not found:
            return [SchemaError("$", "", "the response has no choices")]
        parameters = {}
        for tool in as_list(request.get("tools")):
            function = as_dict(as_dict(tool).get("function"))
            if as_dict(tool).get("type") == "function" and "name" in function:
                parameters[function["name"]] = function.get("parameters", {})
        errors: list[SchemaError] = []
        for choice in found:
            message = as_dict(choice).get("message")
            if not isinstance(message, dict):
                errors.append(SchemaError("$", "", "a choice without a message"))
                continue
            calls = message.get("tool_calls")
            if calls:
                if not isinstance(calls, list):
                    errors.append(SchemaError("tool_calls", "", "tool_calls is not a list"))
                    continue
                shaped = []
                for i, call in enumerate(calls):
                    function = as_dict(call).get("function")
                    if not isinstance(function, dict):
                        errors.append(SchemaError(f"tool_calls[{i}]", "", "not a function call object"))
                        continue
                    shaped.append((f"tool_calls[{i}].function", function.get("name"), function.get("arguments")))
                errors += check_calls(shaped, parameters)
            elif schema is not None:
                errors += check_content(message.get("content"), schema)
        return errors

    def with_feedback(self, request: dict, response: dict, errors: list[SchemaError]) -> dict | None:
        """The conversation so far, the failed answer as it was, then the errors addressed
        to the model (one tool message per call, as the API requires each call answered)."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        message = _first_message(response)
        assistant = {k: v for k, v in message.items() if k in ("content", "tool_calls", "refusal")}
        assistant["role"] = "assistant"
        calls = as_list(message.get("tool_calls"))
        if calls:
            feedback = [{"role": "tool", "tool_call_id": as_dict(call).get("id", ""),
                         "content": call_feedback(errors, f"tool_calls[{i}]")} for i, call in enumerate(calls)]
        else:
            feedback = [{"role": "user", "content": content_feedback(errors)}]
        return {**request, "messages": [*messages, assistant, *feedback]}


SURFACE = ChatCompletions()
