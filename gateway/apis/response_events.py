"""The Responses API's answer in both wire forms: a `response` object, and the SSE event
sequence that streams it.

A stream is `response.created`, `response.in_progress`, the events of each output item
(added, its parts' deltas and dones, done), then one terminal event. OpenAI names each
event twice, in the `event:` line and in the payload's `type`; the frames are recorded as
it sends them, `sequence_number`s and all. Only `response.completed` ends an answer that
is stored; its frame is held back and sent last (as the entry's `tail`), after the answer
is stored, so a client that continues the chain at once finds it. `response.failed` and
`response.incomplete` end a stream that is passed on as it came and never stored, as is
a 200 body whose `status` is not `completed`; an `error` event fails the stream.

A whole answer's stream is synthesized from the body, always the same way: each message
part in one delta, each function call's arguments in one delta, other items added and
done whole, numbered from 0.
"""
from __future__ import annotations

import re
from itertools import count
from typing import Any

import orjson

from gateway.apis.surface import NotAnAnswer, Recorder
from gateway.cache.entry import Entry
from gateway.errors import UpstreamError
from gateway.upstream.sse import frame

COMPLETED = "response.completed"
_UNFINISHED = frozenset({"response.failed", "response.incomplete"})
_EVENT_NAME = re.compile(r"[a-z0-9_.]+\Z")  # what may follow "event: " without breaking the frame
# Fields of the opening response that only the finished answer fills in.
_FINAL = ("usage", "error", "incomplete_details", "completed_at")


class Unfinished(UpstreamError):
    """An answer that ended without completing (incomplete, failed, cancelled, queued):
    passed on as the upstream sent it, with its 200, and never stored."""

    def __init__(self, payload: bytes):
        super().__init__(200, payload)


class ErrorEvent(UpstreamError):
    """An `error` event in the upstream's stream: told to a stream's readers as that event,
    to others as an OpenAI-shaped 502."""

    def __init__(self, event: dict, payload: bytes):
        error = {"message": str(event.get("message") or "the upstream's stream failed"), "type": "upstream_error",
                 "param": event.get("param"), "code": event.get("code")}
        super().__init__(502, orjson.dumps({"error": error}))
        self.event = frame(payload, "error")


def error_frame(exc: UpstreamError) -> bytes:
    """A failure the gateway tells after a stream's headers left, as the Responses wire tells
    one: an `error` event (type, code, message, param), which the SDKs surface as such."""
    try:
        told = orjson.loads(exc.payload())
    except orjson.JSONDecodeError:
        told = None
    error = told.get("error") if isinstance(told, dict) and isinstance(told.get("error"), dict) else {}
    event = {"type": "error", "code": error.get("code") or error.get("type") or "upstream_error",
             "message": str(error.get("message") or f"upstream failed with status {exc.status}"),
             "param": error.get("param")}
    return frame(orjson.dumps(event), "error")


def check(upstream: str, parsed: Any, payload: bytes) -> dict:
    """A completed response; raises NotAnAnswer, Unfinished or the upstream's error."""
    if not isinstance(parsed, dict):
        raise NotAnAnswer(upstream, "not a JSON object")
    if parsed.get("object") != "response":
        if isinstance(parsed.get("error"), dict):
            raise UpstreamError(502, payload)  # an error object with a 200: passed on as the upstream worded it
        raise NotAnAnswer(upstream, "not a response object")
    if not isinstance(parsed.get("output"), list):
        raise NotAnAnswer(upstream, "a response without an output list")
    if parsed.get("status") != "completed":
        raise Unfinished(payload)
    return parsed


def synthesized(response: dict) -> tuple[bytes, bytes]:
    """(the frames before the end, the terminal frame) that stream `response`: its status
    names the terminal event (response.completed, or response.failed / .incomplete for an
    answer passed on unfinished)."""
    numbers = count()
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> bytes:
        out = frame(orjson.dumps({"type": kind, **fields, "sequence_number": next(numbers)}), kind)
        frames.append(out)
        return out

    opening = {**response, "status": "in_progress", "output": [], **{k: None for k in _FINAL if k in response}}
    emit("response.created", response=opening)
    emit("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        _item_events(emit, index, item if isinstance(item, dict) else {})
    status = response.get("status")
    end = emit(f"response.{status}" if isinstance(status, str) and _EVENT_NAME.match(status) else COMPLETED,
               response=response)
    frames.pop()
    return b"".join(frames), end


def _item_events(emit, index: int, item: dict) -> None:
    kind, item_id = item.get("type"), item.get("id")
    if kind == "message":
        emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
        for j, part in enumerate(p if isinstance(p, dict) else {} for p in item.get("content") or ()):
            where = {"item_id": item_id, "output_index": index, "content_index": j}
            if part.get("type") == "output_text":
                text, logprobs = part.get("text", ""), part.get("logprobs") or []
                emit("response.content_part.added", **where, part={**part, "text": "", "annotations": [],
                                                                   **({"logprobs": []} if "logprobs" in part else {})})
                emit("response.output_text.delta", **where, delta=text, logprobs=logprobs)
                emit("response.output_text.done", **where, text=text, logprobs=logprobs)
            elif part.get("type") == "refusal":
                emit("response.content_part.added", **where, part={**part, "refusal": ""})
                emit("response.refusal.delta", **where, delta=part.get("refusal", ""))
                emit("response.refusal.done", **where, refusal=part.get("refusal", ""))
            else:
                emit("response.content_part.added", **where, part=part)
            emit("response.content_part.done", **where, part=part)
    elif kind == "function_call":
        arguments = item.get("arguments", "")
        emit("response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"})
        emit("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=arguments)
        emit("response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=arguments)
    else:
        emit("response.output_item.added", output_index=index, item=item)
    emit("response.output_item.done", output_index=index, item=item)


class EventRecorder(Recorder):
    """One upstream event stream: each event's frame as it came, the terminal one held."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.frames: list[bytes] = []
        self.done: dict[int, Any] = {}  # output index -> the item its output_item.done carried
        self.end: tuple[str, Any, bytes] | None = None  # (terminal event type, its response, its frame)

    def push(self, payload: bytes) -> bytes | None:
        if payload == b"[DONE]":
            return None  # some OpenAI-compatible servers close a Responses stream as they close chat's
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError.broken_stream(self.upstream, f"an event that is not JSON ({exc})") from None
        kind = event.get("type") if isinstance(event, dict) else None
        if not isinstance(kind, str) or not _EVENT_NAME.match(kind):
            raise UpstreamError.broken_stream(self.upstream, "an event without a valid type")
        if self.end is not None:
            raise UpstreamError.broken_stream(self.upstream, f"an event after {self.end[0]}")
        if kind == "error":
            raise ErrorEvent(event, payload)
        out = frame(payload, kind)
        response = event.get("response")
        if isinstance(response, dict) and not self.model:
            self.model = str(response.get("model") or "")
        if kind == "response.output_item.done" and type(event.get("output_index")) is int:
            self.done[event["output_index"]] = event.get("item")
        if kind == COMPLETED or kind in _UNFINISHED:
            self.end = (kind, response, out)
            if kind == COMPLETED:
                return None
        self.frames.append(out)
        return out

    def finish(self) -> Entry:
        if self.end is None:
            raise UpstreamError.broken_stream(self.upstream, f"the stream ended before {COMPLETED}")
        kind, response, end = self.end
        if not isinstance(response, dict):
            raise NotAnAnswer(self.upstream, f"{kind} without a response object")
        if response.get("output") is None and self.done:
            # Deltas built the items; a terminal event may leave them out.
            response = {**response, "output": [self.done[i] for i in sorted(self.done)]}
        payload = orjson.dumps(response)
        if kind != COMPLETED:
            raise Unfinished(payload)
        check(self.upstream, response, payload)
        return Entry(payload, b"".join(self.frames), self.model or str(response.get("model") or ""), "stop", end)
