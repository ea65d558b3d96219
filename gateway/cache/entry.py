"""The stored cache entry: a versioned record holding both wire forms of one answer.

Both forms are computed once, when the entry is written: the non-stream body and the
full SSE stream. Every reader, streaming or not, then gets bytes that were fixed at
write time, so a stream recorded on a miss serves later non-stream requests and a
non-stream answer serves later streams, identically for everyone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import orjson

from gateway.policy.keys import entry_mac, verify_entry

ENTRY_VERSION = 1
DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Entry:
    body: bytes  # the non-stream JSON response
    sse: bytes | None  # the complete event stream ending in [DONE]; None where a route has no stream form
    model: str  # the model version the upstream said answered
    # How the answer was chosen ({"vote": record, "attempts": n}), kept with it so that hits
    # report it as the miss did; None for a plain call.
    meta: dict[str, Any] | None = None


class CorruptEntry(ValueError):
    pass


class TamperedEntry(CorruptEntry):
    """The stored bytes are not what this gateway sealed under this key: altered in the
    store, copied from another key, or sealed with another secret."""


def encode(entry: Entry) -> bytes:
    record = {
        "v": ENTRY_VERSION,
        "model": entry.model,
        "body": entry.body.decode(),
        "sse": None if entry.sse is None else entry.sse.decode(),
    }
    if entry.meta:
        record["meta"] = entry.meta
    return orjson.dumps(record)


def decode(raw: bytes) -> Entry:
    try:
        record = orjson.loads(raw)
        if record["v"] != ENTRY_VERSION:
            raise CorruptEntry(f"entry version {record['v']!r}, this gateway reads {ENTRY_VERSION}")
        sse = record["sse"]
        meta = record.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise CorruptEntry("entry meta is not an object")
        return Entry(record["body"].encode(), None if sse is None else sse.encode(), record["model"], meta)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptEntry(f"unreadable cache entry: {exc}") from exc


def sse_event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def render_sse(events: Iterable[bytes]) -> bytes:
    return b"".join(sse_event(e) for e in events) + DONE


def from_body(route: str, body: bytes) -> Entry:
    """A non-stream answer; its stream form is synthesized deterministically from it."""
    parsed = orjson.loads(body)
    model = str(parsed.get("model") or "")
    if route == "chat.completions":
        return Entry(body, render_sse(orjson.dumps(c) for c in _chat_chunks(parsed)), model)
    if route == "completions":
        return Entry(body, render_sse(orjson.dumps(c) for c in _completion_chunks(parsed)), model)
    return Entry(body, None, model)


def from_events(route: str, events: list[bytes]) -> Entry:
    """A recorded stream (event payloads without [DONE]); its body form is assembled from it."""
    chunks = [orjson.loads(e) for e in events]
    if not chunks:
        raise ValueError("a stream without a single event")
    body = (_assemble(chunks, "chat.completion", _new_chat_choice, _add_chat_delta) if route == "chat.completions"
            else _assemble(chunks, "text_completion", _new_text_choice, _add_text_delta))
    return Entry(orjson.dumps(body), render_sse(events), str(body.get("model") or ""))


def _header(parsed: dict[str, Any], obj: str) -> dict[str, Any]:
    head = {"id": parsed.get("id"), "object": obj, "created": parsed.get("created"), "model": parsed.get("model")}
    if "system_fingerprint" in parsed:
        head["system_fingerprint"] = parsed["system_fingerprint"]
    return head


def _with_usage(chunks: list[dict[str, Any]], parsed: dict[str, Any]) -> list[dict[str, Any]]:
    # Usage rides on the last chunk that has choices, so clients that read
    # chunk.choices[0] on every chunk never meet an empty choices list.
    if parsed.get("usage") is not None and chunks:
        chunks[-1]["usage"] = parsed["usage"]
    return chunks


def _chat_chunks(parsed: dict[str, Any]) -> list[dict[str, Any]]:
    head = _header(parsed, "chat.completion.chunk")
    chunks = []
    for choice in parsed.get("choices") or []:
        message = choice.get("message") or {}
        delta = {k: v for k, v in message.items() if v is not None and k != "tool_calls"}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        index = choice.get("index", 0)
        chunks.append({**head, "choices": [{"index": index, "delta": delta, "logprobs": choice.get("logprobs"), "finish_reason": None}]})
        chunks.append({**head, "choices": [{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.get("finish_reason")}]})
    return _with_usage(chunks, parsed)


def _completion_chunks(parsed: dict[str, Any]) -> list[dict[str, Any]]:
    head = _header(parsed, "text_completion")
    chunks = [{**head, "choices": [choice]} for choice in parsed.get("choices") or []]
    return _with_usage(chunks, parsed)


def _merge_logprobs(into: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    if not more:
        return into
    merged = dict(into or {})
    for name, value in more.items():
        if isinstance(value, list):
            merged[name] = (merged.get(name) or []) + value
        elif value is not None or name not in merged:
            merged[name] = value
    return merged


def _assemble(chunks: list[dict[str, Any]], obj: str, new_choice, add_delta) -> dict[str, Any]:
    """The non-stream body that a recorded stream of chunks stands for."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for part in chunk.get("choices") or []:
            index = part.get("index", 0)
            choice = choices.setdefault(index, new_choice(index))
            add_delta(choice, part)
            choice["logprobs"] = _merge_logprobs(choice["logprobs"], part.get("logprobs"))
            choice["finish_reason"] = part.get("finish_reason") or choice["finish_reason"]
    body = {**_header(chunks[0], obj), "choices": [choices[i] for i in sorted(choices)]}
    if usage is not None:
        body["usage"] = usage
    return body


def _new_chat_choice(index: int) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": None}, "logprobs": None, "finish_reason": None}


def _add_chat_delta(choice: dict[str, Any], part: dict[str, Any]) -> None:
    message = choice["message"]
    for name, value in (part.get("delta") or {}).items():
        if name == "tool_calls":
            _merge_tool_calls(message.setdefault("tool_calls", []), value or [])
        elif isinstance(value, str) and name != "role":
            message[name] = (message.get(name) or "") + value
        elif value is not None:
            message[name] = value


def _new_text_choice(index: int) -> dict[str, Any]:
    return {"index": index, "text": "", "logprobs": None, "finish_reason": None}


def _add_text_delta(choice: dict[str, Any], part: dict[str, Any]) -> None:
    choice["text"] += part.get("text") or ""


def _merge_tool_calls(calls: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> None:
    for delta in deltas:
        index = delta.get("index", 0)
        while len(calls) <= index:
            calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        call = calls[index]
        call["id"] = delta.get("id") or call["id"]
        call["type"] = delta.get("type") or call["type"]
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""


class Sealer:
    """Binds each stored value to its key with a MAC, so an entry edited in the store, or
    copied under another key, reads as corrupt instead of being served."""

    MAC_LEN = 64  # hex digits of keys.entry_mac
    MEMO = 4096  # entries whose checked bytes are remembered

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        # key -> (value, entry) already checked: a hot key's bytes are compared, not re-MACed
        # and re-parsed, on every hit. A changed value (a refresh) simply misses the memo.
        self._memo: dict[str, tuple[bytes, Entry]] = {}

    def seal(self, key: str, entry: Entry) -> bytes:
        raw = encode(entry)
        return entry_mac(self.secret, key, raw).encode() + raw

    def open(self, key: str, value: bytes) -> Entry:
        seen = self._memo.get(key)
        if seen is not None and seen[0] == value:
            return seen[1]
        mac, raw = value[: self.MAC_LEN], value[self.MAC_LEN:]
        if not verify_entry(self.secret, key, raw, mac.decode("ascii", "replace")):
            raise TamperedEntry("cache entry fails its MAC check")
        entry = decode(raw)
        if len(self._memo) >= self.MEMO:
            del self._memo[next(iter(self._memo))]
        self._memo[key] = (value, entry)
        return entry
