"""Tool calls in a model's answer, per model family, as OpenAI `tool_calls`.

The family is the form the chat template teaches the model (read from the template's text):
  * hermes (Qwen2, Qwen2.5, Qwen3 and other ChatML templates with tools): each call a block
    `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, text before the first one
    being the message's content;
  * llama3_json (Llama 3.1 / 3.2 / 3.3): the answer is `{"name": ..., "parameters": {...}}`,
    optionally after `<|python_tag|>`, several separated by `;`.
A call's id is derived from the request's seed, its prompt and the call's position, so that
replaying a request (same seed) gives the same ids.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from local_backend import grammar

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclasses.dataclass(frozen=True)
class Call:
    name: str
    arguments: str   # the JSON text of the arguments object, as OpenAI sends it


def family(template_source: str | None) -> str | None:
    """The tool-call form a chat template teaches, None for a template that teaches none."""
    if not template_source:
        return None
    if HERMES_OPEN in template_source:
        return "hermes"
    if PYTHON_TAG in template_source or '"parameters"' in template_source:
        return "llama3_json"
    return None


def call_id(seed: int, prompt_digest: str, index: int) -> str:
    digest = hashlib.blake2b(f"{seed}|{prompt_digest}|{index}".encode(), digest_size=12).hexdigest()
    return f"call_{digest}"


def prompt_digest(prompt: list[int]) -> str:
    return hashlib.blake2b(json.dumps(prompt).encode(), digest_size=8).hexdigest()


def _call(obj, key: str) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(key, {})
    if isinstance(args, str):   # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_objects(text: str) -> list | None:
    """The JSON values of `text`, written one after another (separated by whitespace or `;`)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
        if at == len(text):
            return out
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        out.append(value)


def parse(kind: str, text: str) -> tuple[str, list[Call]]:
    """(content, calls) of a finished answer; text that is not a well-formed call stays content."""
    if kind == "hermes":
        start = text.find(HERMES_OPEN)
        if start < 0:
            return text, []
        calls, rest = [], text[start:]
        while rest.startswith(HERMES_OPEN):
            end = rest.find(HERMES_CLOSE)
            if end < 0:
                return text, []
            objects = _json_objects(rest[len(HERMES_OPEN):end])
            call = _call(objects[0], "arguments") if objects and len(objects) == 1 else None
            if call is None:
                return text, []
            calls.append(call)
            rest = rest[end + len(HERMES_CLOSE):].lstrip()
        if rest:
            return text, []
        return text[:start].rstrip(), calls
    if kind == "llama3_json":
        body = text.strip()
        body = body[len(PYTHON_TAG):] if body.startswith(PYTHON_TAG) else body
        if not body.startswith("{"):
            return text, []
        objects = _json_objects(body)
        calls = [_call(o, "parameters" if "parameters" in o else "arguments") for o in objects or []
                 if isinstance(o, dict)]
        if not objects or len(calls) != len(objects) or None in calls:
            return text, []
        return "", calls
    raise ValueError(f"unknown tool-call family {kind!r}")


def may_start_call(kind: str, text: str) -> int:
    """Where in streamed `text` a call may begin: text before it can be sent as content, what
    follows is held until the answer ends. len(text) when no call can start in it."""
    if kind == "hermes":
        at = text.find(HERMES_OPEN)
        if at >= 0:
            return at
        for keep in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1):   # a marker cut by a token boundary
            if HERMES_OPEN.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)
    stripped = text.lstrip()
    if not stripped or stripped[0] in "{<":   # Llama's calls are the whole answer
        return 0
    return len(text)


def _lark_string(s: str) -> str:
    return json.dumps(s)


def _call_schema(kind: str, tool, loose: bool) -> dict:
    """A call of `tool` as JSON; loose: any arguments object (a tool not declared strict)."""
    f = tool.function
    params = f.parameters if f.parameters is not None and not loose else {"type": "object"}
    key = "arguments" if kind == "hermes" else "parameters"
    return {"type": "object", "properties": {"name": {"const": f.name}, key: params},
            "required": ["name", key], "additionalProperties": False}


# Text that holds no call: the answer of a model that chose not to call (tool_choice auto).
NOT_HERMES = r"/(.|\n)*/ & ~/(.|\n)*<tool_call>(.|\n)*/"
NOT_LLAMA = r"/(.|\n)*/ & ~/\s*(\{|<\|python_tag\|>)(.|\n)*/"


def call_grammar(kind: str, tools: list, parallel: bool, optional: bool = False) -> str:
    """A grammar whose answers are one or more calls (one when not parallel) of `tools` in the
    family's form. optional (tool_choice auto): an answer may instead be text without calls, or
    (hermes) text and then calls; the arguments of tools declared `strict` are held to their
    schema, other tools' to any object. Otherwise every tool's arguments are held to its schema."""
    schemas = [_call_schema(kind, t, optional and not t.function.strict) for t in tools]
    schema = {"anyOf": schemas} if len(schemas) > 1 else schemas[0]
    schema["x-guidance"] = grammar.JSON_OPTIONS
    call = f"call: %json {json.dumps(schema)}\n"
    if kind == "hermes":
        nl, close, more = _lark_string("\n"), _lark_string("\n" + HERMES_CLOSE), \
            _lark_string("\n" + HERMES_OPEN + "\n")
        rest = f"{nl} call {close}" + (f" ({more} call {close})*" if parallel else "")
        if optional:
            # `pre` ends where the model writes <tool_call> (its stop string, kept in the text).
            return grammar.lark(f"start: TEXT | pre rest\nTEXT: {NOT_HERMES}\n"
                                f'pre[stop={_lark_string(HERMES_OPEN)}]: /(.|\\n)*/\nrest: {rest}\n{call}')
        return grammar.lark(f"start: {_lark_string(HERMES_OPEN)} rest\nrest: {rest}\n{call}")
    calls = 'call ("; " call)*' if parallel else "call"
    if optional:
        return grammar.lark(f"start: TEXT | {_lark_string(PYTHON_TAG)}? {calls}\nTEXT: {NOT_LLAMA}\n{call}")
    return grammar.lark(f"start: {calls}\n{call}")
