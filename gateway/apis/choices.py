"""What chat and text completions share: answers made of choices, streamed as chunks.

A stream is recorded as the frames its readers are sent, with usage taken out: the
upstream is always asked for usage (`stream_options.include_usage`), and the usage
chunk becomes the entry's `tail`, sent only to a reader that asked for it. So a reader
that never asked for usage never meets a chunk with no choices (a plain
`chunk.choices[0]` loop would crash on it), one that asked always gets it, and a body
assembled from the stream always has `usage`.

Assembly merges every delta as the wire defines it: strings are appended (content,
refusal, tool-call arguments, audio transcript; audio data, base64 piece by piece, is
joined as the bytes it encodes), identity fields are set once
(id, type, role, expires_at), lists are joined (logprobs), lists of indexed parts
(tool calls) are merged by index, objects merge field by field. A delta field this
module does not know is merged by the same rules rather than dropped.

A complete answer has at least one choice and a finish reason on every choice; a stream
is complete at `[DONE]`. `abort` (vLLM's request cancelled) and `error` are not finish
reasons of an answer.
"""
from __future__ import annotations

import base64
from typing import Any, Callable

import orjson

from gateway.apis.surface import NotAnAnswer, Recorder, Surface, View
from gateway.cache.entry import Entry
from gateway.errors import UpstreamError
from gateway.upstream.sse import frame

DONE = b"data: [DONE]\n\n"
_IDENTITY = frozenset({"id", "type", "role", "object", "expires_at", "index"})
_NOT_HEAD = frozenset({"choices", "usage", "object", "obfuscation"})
_UNFINISHED = (None, "abort", "error")


def _join_base64(have: Any, more: str) -> str:
    """Two base64 texts as the one that encodes both their bytes: each streamed audio piece
    is encoded alone, so text appends only after a piece that ends on a whole group."""
    if not isinstance(have, str) or not have:
        return more
    if len(have) % 4 == 0 and not have.endswith("="):
        return have + more
    try:
        return base64.b64encode(base64.b64decode(have) + base64.b64decode(more)).decode()
    except ValueError:  # not base64 after all: kept as sent
        return have + more


# String fields joined otherwise than by appending text: audio data is base64, piece by piece.
_JOINED = {"data": _join_base64}


def merge(into: dict[str, Any], delta: dict[str, Any]) -> None:
    """Adds one delta to what the deltas before it built (see the module docstring)."""
    for name, value in delta.items():
        have = into.get(name)
        if value is None:
            into.setdefault(name, None)
        elif isinstance(value, str) and name in _JOINED:
            into[name] = _JOINED[name](have, value)
        elif isinstance(value, str) and name not in _IDENTITY:
            into[name] = (have if isinstance(have, str) else "") + value
        elif isinstance(value, dict):
            if not isinstance(have, dict):
                have = into[name] = {}
            merge(have, value)
        elif isinstance(value, list) and value and all(isinstance(v, dict) and "index" in v for v in value):
            if not isinstance(have, list):
                have = into[name] = []
            _merge_indexed(have, value)
        elif isinstance(value, list):
            into[name] = (have if isinstance(have, list) else []) + value
        else:
            into[name] = value


def _merge_indexed(parts: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> None:
    for delta in deltas:
        index = delta["index"]
        found = next((p for p in parts if p.get("index") == index), None)
        if found is None:
            parts.append(found := {"index": index})
        merge(found, delta)


def add_tail(choice: dict[str, Any], part: dict[str, Any]) -> None:
    """What a chunk's choice carries beside its content, for both kinds: logprobs (merged
    like a delta) and the finish reason."""
    if isinstance(part.get("logprobs"), dict):
        if not isinstance(choice["logprobs"], dict):
            choice["logprobs"] = {}
        merge(choice["logprobs"], part["logprobs"])
    if part.get("finish_reason") is not None:
        choice["finish_reason"] = part["finish_reason"]


def head(parsed: dict[str, Any], obj: str) -> dict[str, Any]:
    """The envelope of an answer or chunk (id, created, model, fingerprint, tier, ...)
    under another object name."""
    out = {k: v for k, v in parsed.items() if k not in _NOT_HEAD}
    return {"id": out.pop("id", None), "object": obj, **out}


def usage_frame(parsed: dict[str, Any], chunk_object: str) -> bytes | None:
    """The usage chunk OpenAI sends last when a stream asks for it; None without usage."""
    if parsed.get("usage") is None:
        return None
    return frame(orjson.dumps({**head(parsed, chunk_object), "choices": [], "usage": parsed["usage"]}))


def finish_class(choices: list[dict[str, Any]]) -> str:
    """The entry's finish: the one of its choices that decides whether it is stored."""
    reasons = {c.get("finish_reason") for c in choices}
    for worst in ("content_filter", "length"):
        if worst in reasons:
            return worst
    return "stop"


def check_answer(upstream: str, parsed: Any, payload: bytes) -> list[dict[str, Any]]:
    """The choices of a complete answer; NotAnAnswer for anything else."""
    if not isinstance(parsed, dict):
        raise NotAnAnswer(upstream, "not a JSON object")
    if parsed.get("error") is not None:
        raise UpstreamError(502, payload)  # an error object with a 200: passed on as the upstream worded it
    choices = parsed.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        raise NotAnAnswer(upstream, "no choices")
    unfinished = [c.get("index", i) for i, c in enumerate(choices) if c.get("finish_reason") in _UNFINISHED]
    if unfinished:
        raise NotAnAnswer(upstream, f"choice(s) {unfinished} have no finish_reason (or ended with abort/error)")
    return choices


class ChoicesRecorder(Recorder):
    """A chat or text completion stream: frames without usage, assembled on finish."""

    def __init__(self, upstream: str, body_object: str, chunk_object: str,
                 add: Callable[[dict[str, Any], dict[str, Any]], None],
                 new_choice: Callable[[int], dict[str, Any]],
                 settle: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> None:
        self.upstream = upstream
        self.body_object = body_object
        self.chunk_object = chunk_object
        self.add = add
        self.new_choice = new_choice
        self.settle = settle
        self.frames: list[bytes] = []
        self.envelope: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.last: dict[int, dict[str, Any]] = {}  # each choice's last part, for `settle`
        self.usage: Any = None
        self.done = False

    def push(self, payload: bytes) -> bytes | None:
        if payload == b"[DONE]":
            self.done = True
            return None
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError.broken_stream(self.upstream, f"an event that is not JSON ({exc})") from None
        if not isinstance(chunk, dict):
            raise UpstreamError.broken_stream(self.upstream, "an event that is not a JSON object")
        if "error" in chunk:
            raise UpstreamError(502, payload)
        if "usage" in chunk:
            usage = chunk.pop("usage")
            self.usage = usage if usage is not None else self.usage
            if not chunk.get("choices"):
                self._envelope(chunk)
                return None  # the usage chunk: sent later, to the readers that asked for it
            payload = orjson.dumps(chunk)
        self._envelope(chunk)
        for part in chunk.get("choices") or ():
            if isinstance(part, dict):
                index = part.get("index", 0)
                self.add(self.choices.setdefault(index, self.new_choice(index)), part)
                self.last[index] = part
        out = frame(payload)
        self.frames.append(out)
        return out

    def _envelope(self, chunk: dict[str, Any]) -> None:
        for name, value in chunk.items():
            if name not in _NOT_HEAD and value is not None:
                self.envelope.setdefault(name, value)

    @property
    def model(self) -> str:
        return str(self.envelope.get("model") or "")

    @property
    def fingerprint(self) -> str | None:
        value = self.envelope.get("system_fingerprint")
        return value if isinstance(value, str) and value else None

    def finish(self) -> Entry:
        if not self.done:
            raise UpstreamError.broken_stream(self.upstream, "the stream ended before [DONE]")
        assembled = [self.choices[i] for i in sorted(self.choices)]
        for choice in assembled if self.settle else ():
            self.settle(choice, self.last[choice["index"]])
        body = {**head(self.envelope, self.body_object), "choices": assembled}
        if self.usage is not None:
            body["usage"] = self.usage
        payload = orjson.dumps(body)
        choices = check_answer(self.upstream, body, payload)
        return Entry(payload, b"".join(self.frames), str(body.get("model") or ""), finish_class(choices),
                     usage_frame(body, self.chunk_object))


class ChoicesSurface(Surface):
    """What the chat and text completion surfaces share: their sampling parameters, how a
    request asks for usage, what the upstream is sent, rendering, fingerprints and n > 1."""

    sampling = frozenset({"temperature", "top_p", "top_k", "seed", "n"})

    def view(self, body: dict) -> View:
        options = body.get("stream_options")
        return View(stream=body.get("stream") is True,
                    usage=isinstance(options, dict) and options.get("include_usage") is True, echo=self.echo_of(body))

    def upstream_body(self, sent: dict, stream: bool) -> dict:
        out = {k: v for k, v in sent.items() if k not in ("stream", "stream_options")}
        if stream:
            options = sent.get("stream_options")
            out["stream"] = True
            out["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return out

    def render(self, entry: Entry, view: View) -> bytes:
        if not view.stream or entry.stream is None:
            return self.echo_body(entry.body, view)
        return self.echo_stream(entry.stream, view) + self.stream_end(entry, view)

    def stream_end(self, entry: Entry, view: View) -> bytes:
        return self.echo_frame(entry.tail or b"", view) + DONE if view.usage else DONE

    def fingerprint(self, body: bytes) -> str | None:
        parsed = orjson.loads(body)
        value = parsed.get("system_fingerprint") if isinstance(parsed, dict) else None
        return value if isinstance(value, str) and value else None

    def merge_n(self, responses: list[dict]) -> dict | None:
        return merge_n(responses)


def merge_n(responses: list[dict[str, Any]]) -> dict[str, Any]:
    """One response from the answers to n one-answer requests (seeds seed..seed+n-1), in
    order: the first one's envelope; choice j of prompt p numbered p*n + j, as
    OpenAI-compatible servers number n > 1 over several prompts; usage as the provider
    bills n (the prompt once, completions summed)."""
    n = len(responses)
    if not n:
        raise ValueError("merge_n needs at least one response")
    choices = []
    for j, response in enumerate(responses):
        for choice in response.get("choices") or []:
            choices.append({**choice, "index": choice.get("index", 0) * n + j})
    choices.sort(key=lambda c: c["index"])
    merged = {**responses[0], "choices": choices}
    usages = [r["usage"] for r in responses if isinstance(r.get("usage"), dict)]
    if len(usages) == n:
        prompt = usages[0].get("prompt_tokens", 0)
        completion = sum(u.get("completion_tokens", 0) for u in usages)
        merged["usage"] = {**usages[0], "prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
        details = [u.get("completion_tokens_details") for u in usages]
        if all(isinstance(d, dict) for d in details):
            merged["usage"]["completion_tokens_details"] = _sum_counts(details)
    return merged


def _sum_counts(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for name, value in d.items():
            if type(value) in (int, float):
                out[name] = out.get(name, 0) + value
    return out
