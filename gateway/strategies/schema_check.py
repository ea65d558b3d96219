"""Validating answers against JSON schemas, and telling the model what to fix.

An answer is checked when its request asks for structure: `response_format` of type
`json_schema` (its schema) or `json_object` (any JSON object), or a schema named by
config / `x-detgate-schema`; and every tool call is checked against its tool's
`parameters`. Validation is JSON Schema draft 2020-12 with formats checked (date-time,
date, time, email, uuid, ipv4/6, ...: those whose checkers are installed, which
jsonschema[format] provides).

Each failure is a SchemaError: where in the answer (a JSONPath like
`$.items[2].price`), which schema keyword failed (a JSON pointer into the schema like
`#/properties/items/items/properties/price/minimum`) and jsonschema's message. Errors
come sorted, so the same answer always yields the same list and the same feedback.

`feedback_messages` builds what a retry appends to the conversation, in the spirit of
instructor: the model's own failed answer, then the validation errors and a request to
answer again. Tool calls are answered with one tool message per call (the API requires
each tool call to be answered before the next turn).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import orjson
from jsonschema import Draft202012Validator

JSON_OBJECT = {"type": "object"}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class SchemaError:
    path: str         # JSONPath of the failing value in the answer; "$" is the whole answer
    schema_path: str  # JSON pointer of the failing keyword in the schema; "" when no schema ran
    message: str

    def __str__(self) -> str:
        where = f" (schema {self.schema_path})" if self.schema_path else ""
        return f"{self.path}: {self.message}{where}"


def requested_schema(body: Mapping[str, Any], named: Mapping[str, dict] = {},
                     name: str | None = None) -> dict | None:
    """The schema the message content must satisfy, or None when the request asks for no
    structure. A `name` (from config or x-detgate-schema) wins over response_format;
    an unknown name is a KeyError naming the known ones."""
    if name is not None:
        if name not in named:
            raise KeyError(f"no schema named {name!r}; known: {sorted(named)}")
        return named[name]
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        if response_format.get("type") == "json_object":
            return JSON_OBJECT
        spec = response_format.get("json_schema")
        if response_format.get("type") == "json_schema" and isinstance(spec, Mapping):
            return spec.get("schema", {})
    return None


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a valid draft 2020-12 schema, or None. Check it before any
    upstream call, so a bad schema is the client's 400 and not R failed attempts."""
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"{_schema_pointer(exc.absolute_path)}: {exc.message}"
    return None


def _json_path(path: Sequence[str | int], root: str = "$") -> str:
    out = root
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif _IDENTIFIER.match(step):
            out += f".{step}"
        else:
            out += "[" + orjson.dumps(step).decode() + "]"
    return out


def _schema_pointer(path: Sequence[str | int]) -> str:
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def validate(instance: Any, schema: Mapping[str, Any], root: str = "$") -> list[SchemaError]:
    """Every way `instance` fails `schema`, sorted by place in the answer and schema."""
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = [SchemaError(_json_path(e.absolute_path, root), _schema_pointer(e.absolute_schema_path), e.message)
              for e in validator.iter_errors(instance)]
    return sorted(errors, key=lambda e: (e.path, e.schema_path, e.message))


def _parse(text: Any, root: str) -> tuple[Any, list[SchemaError]]:
    if not isinstance(text, str):
        return None, [SchemaError(root, "", f"expected a JSON string, got {type(text).__name__}")]
    try:
        return orjson.loads(text), []
    except orjson.JSONDecodeError as exc:
        return None, [SchemaError(root, "", f"not valid JSON: {exc}")]


def check_content(content: Any, schema: Mapping[str, Any]) -> list[SchemaError]:
    """Parse the message content as JSON and validate it; [] when it is valid."""
    instance, errors = _parse(content, "$")
    return errors or validate(instance, schema)


def check_tool_calls(tool_calls: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
                     ) -> list[SchemaError]:
    """Validate each call's arguments against its tool's `parameters`. Paths start at
    `tool_calls[i].function.arguments`; a call to a tool the request did not offer is
    itself an error."""
    parameters = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) and tool.get("type") == "function" else None
        if isinstance(function, Mapping) and "name" in function:
            parameters[function["name"]] = function.get("parameters", {})
    errors: list[SchemaError] = []
    for i, call in enumerate(tool_calls):
        root = f"tool_calls[{i}].function.arguments"
        # The upstream's output is not trusted to be well formed.
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            errors.append(SchemaError(f"tool_calls[{i}]", "", "not a function call object"))
            continue
        name = function.get("name")
        if name not in parameters:
            errors.append(SchemaError(f"tool_calls[{i}].function.name", "",
                                      f"{name!r} is not one of the offered tools {sorted(parameters)}"))
            continue
        instance, parse_errors = _parse(function.get("arguments"), root)
        errors += parse_errors or validate(instance, parameters[name], root)
    return errors


def check_message(message: Mapping[str, Any], body: Mapping[str, Any], named: Mapping[str, dict] = {},
                  name: str | None = None) -> list[SchemaError]:
    """All schema failures of one assistant message answering `body`: its content
    against the requested schema (when one is asked for and the model did not call a
    tool instead) and its tool calls against the offered tools."""
    errors: list[SchemaError] = []
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, Sequence) or isinstance(calls, str):
            return [SchemaError("tool_calls", "", "tool_calls is not a list")]
        errors += check_tool_calls(calls, body.get("tools") or [])
    schema = requested_schema(body, named, name)
    if schema is not None and not calls:
        errors += check_content(message.get("content"), schema)
    return errors


def summary(errors: Sequence[SchemaError], limit: int = 5) -> str:
    """One line for the final error when every attempt failed."""
    shown = "; ".join(str(e) for e in errors[:limit])
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return f"the answer does not match its schema: {shown}{more}"


def feedback_messages(message: Mapping[str, Any], errors: Sequence[SchemaError]) -> list[dict]:
    """The messages a retry appends after the conversation so far: the failed assistant
    message as it was, then the errors, addressed to the model."""
    assistant = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "refusal")}
    assistant["role"] = "assistant"
    calls = message.get("tool_calls") or []
    if calls:
        return [assistant, *(_tool_feedback(i, call, errors) for i, call in enumerate(calls))]
    return [assistant, {
        "role": "user",
        "content": "Your answer does not match the required JSON schema. Errors (JSONPath in "
                   "your answer: problem (failing schema keyword)):\n"
                   f"{_listing(errors)}\nAnswer again with only the corrected JSON.",
    }]


def _listing(errors: Sequence[SchemaError]) -> str:
    return "\n".join(f"- {e}" for e in errors)


def _tool_feedback(i: int, call: Mapping[str, Any], errors: Sequence[SchemaError]) -> dict:
    own = [e for e in errors if e.path.startswith(f"tool_calls[{i}].")]
    content = (f"Rejected, not run: the arguments do not match the tool's schema.\n{_listing(own)}\n"
               "Call the tool again with arguments that fix every error." if own else
               "Not run, because another tool call in this turn was rejected; call it again.")
    call_id = call.get("id", "") if isinstance(call, Mapping) else ""
    return {"role": "tool", "tool_call_id": call_id, "content": content}
