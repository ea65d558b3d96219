"""Validating answers against JSON schemas.

An answer is checked when its request asks for structure (each API surface says how:
gateway/apis), or a schema is named by config / `x-detgate-schema`; and every tool call
is checked against its tool's `parameters`. Validation is JSON Schema draft 2020-12
with formats checked (date-time, date, time, email, uuid, ipv4/6, ...: those whose
checkers are installed, which jsonschema[format] provides).

Each failure is a SchemaError: where in the answer (a JSONPath like
`$.items[2].price`), which schema keyword failed (a JSON pointer into the schema like
`#/properties/items/items/properties/price/minimum`) and jsonschema's message. Errors
come sorted, so the same answer always yields the same list and the same feedback.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.strategies.schema_memo import SCHEMAS

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


def named_schema(named: Mapping[str, dict], name: str) -> dict:
    """A schema from config, picked by config or x-detgate-schema; a KeyError names the known ones."""
    if name not in named:
        raise KeyError(f"no schema named {name!r}; known: {sorted(named)}")
    return named[name]


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a valid draft 2020-12 schema, or None. Check it before any
    upstream call, so a bad schema is the client's 400 and not R failed attempts. Each
    distinct schema is checked once per process (schema_memo), its answer remembered."""
    error = SCHEMAS.error(schema)
    return None if error is None else f"{_schema_pointer(error.absolute_path)}: {error.message}"


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
    validator = SCHEMAS.validator(schema)
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


def check_calls(calls: Sequence[tuple[str, Any, Any]], parameters: Mapping[str, Any]) -> list[SchemaError]:
    """Validate tool calls, each (path of the call, tool name, arguments as sent), against
    the `parameters` schema of the tool of that name; a call to a tool the request did not
    offer is itself an error."""
    errors: list[SchemaError] = []
    for root, name, arguments in calls:
        if not isinstance(name, str) or name not in parameters:
            errors.append(SchemaError(f"{root}.name", "", f"{name!r} is not one of the offered tools {sorted(parameters)}"))
            continue
        instance, parse_errors = _parse(arguments, f"{root}.arguments")
        errors += parse_errors or validate(instance, parameters[name], f"{root}.arguments")
    return errors


def summary(errors: Sequence[SchemaError], limit: int = 5) -> str:
    """One line for the final error when every attempt failed."""
    shown = "; ".join(str(e) for e in errors[:limit])
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return f"the answer does not match its schema: {shown}{more}"


def _listing(errors: Sequence[SchemaError]) -> str:
    return "\n".join(f"- {e}" for e in errors)


def content_feedback(errors: Sequence[SchemaError]) -> str:
    """What a retry tells the model of an answer whose content fails its schema."""
    return ("Your answer does not match the required JSON schema. Errors (JSONPath in your answer: problem "
            f"(failing schema keyword)):\n{_listing(errors)}\nAnswer again with only the corrected JSON.")


def call_feedback(errors: Sequence[SchemaError], path: str) -> str:
    """What a retry tells the model of the tool call at `path` (each call must be answered):
    its own errors, or that another call of the turn was rejected."""
    own = [e for e in errors if e.path.startswith(path + ".")]
    if not own:
        return "Not run, because another tool call in this turn was rejected; call it again."
    return (f"Rejected, not run: the arguments do not match the tool's schema.\n{_listing(own)}\n"
            "Call the tool again with arguments that fix every error.")
