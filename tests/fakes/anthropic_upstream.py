"""A fake Anthropic Messages provider, as nondeterministic as the real one.

Every call gets a new message id, tool-use ids, thinking signature and text, and every
stream is cut differently: text and tool input in pieces of random size, `ping` events in
random places, events split across TCP writes at random. It checks what the real API
checks for the cases the tests aim at: a key (`x-api-key`, or a bearer token) and an
`anthropic-version` on every call, `max_tokens`, and the sampling parameters each model
family takes (the newest Claude models take none, the 4.5/4.6 generation not temperature
and top_p together, extended thinking no temperature but 1 and no top_k). It can be told
to fail, to send an `error` event or break a stream off, and it records what it was sent.
Given `faults` (fakes/faults.py), each call fails as that plan draws, in Anthropic's own
shapes: 500 api_error, 429 rate_limit_error, 529 overloaded_error, an `error` event mid-stream.
A `container` must name one it made (else a 404); a request naming one, or offering the
code execution tool, is answered with its container (a new one when none is named).

Run alone (for benchmarks, taking calls without a key): python tests/fakes/anthropic_upstream.py --port 9001
"""
from __future__ import annotations

import asyncio
import base64
import random
import secrets
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import orjson
from aiohttp import web

from fakes.faults import FAULT, Faults, drop
from fakes.loopback import write_scattered
from fakes.openai_upstream import WORDS, Noise, dumps, serve

# Model families by what they take (as the provider's docs and its 400s describe them).
NO_SAMPLING = ("claude-opus-4-7*", "claude-opus-4-8*", "claude-opus-5*", "claude-sonnet-5*", "claude-haiku-5*",
               "claude-fable-*", "claude-mythos-*")
ONE_OF_TEMPERATURE_TOP_P = ("claude-opus-4-1*", "claude-opus-4-5*", "claude-opus-4-6*", "claude-sonnet-4-5*",
                            "claude-sonnet-4-6*", "claude-haiku-4-5*")
# The request members the API takes; any other is refused, as the API refuses extra inputs.
FIELDS = frozenset({"model", "max_tokens", "messages", "system", "metadata", "stop_sequences", "stream",
                    "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking", "service_tier",
                    "output_config", "output_format", "cache_control", "container", "inference_geo", "speed",
                    "context_management"})
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}


@dataclass
class Behaviour:
    """What the next calls do; tests change these between requests."""

    fail_status: int | None = None  # answer every call with this status, in Anthropic's error shape
    fail_times: int | None = None  # ...only this many times (None: until reset)
    retry_after: str | None = "0"
    delay_s: float = 0.0  # before answering
    chunk_delay_s: float = 0.0  # between TCP writes of a stream
    pace_s: float = 0.0  # spread each stream over about this long (a slow model)
    break_stream_after: int | None = None  # close a stream after this many events, without message_stop
    error_after: int | None = None  # a stream sends an overloaded `error` event after this many events
    error_200: bool = False  # a 200 whose body is an error
    stop_reason: str | None = None  # another stop reason than the answer's usual one
    unfinished: bool = False  # no stop reason: a body's is null, a stream's message_delta never comes
    answer: str | None = None  # every call's text (ids, usage and chunking still vary); None: random words
    invalid_input_times: int = 0  # the next tool uses have input that breaks its schema


@dataclass
class FakeAnthropic:
    noise: Noise = field(default_factory=Noise)
    behaviour: Behaviour = field(default_factory=Behaviour)
    calls: list[tuple[str, dict]] = field(default_factory=list)  # (path, body)
    headers: list[dict[str, str]] = field(default_factory=list)  # each call's headers, names lower-cased
    check_key: bool = True  # off only when run alone for benchmarks, where no key is configured
    stream_ends: list[float] = field(default_factory=list)  # time.monotonic() as each whole stream was sent
    faults: Faults | None = None  # a fault per call, for load runs (bench/load_faults.py)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.noise.seed)
        self.containers: set[str] = set()

    def reset(self) -> None:
        # New objects, not cleared ones: a call still sleeping from an earlier test records
        # into, and takes its behaviour from, that test's.
        self.behaviour = Behaviour()
        self.calls = []
        self.headers = []
        self.stream_ends = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        return app

    # ---- the calls

    async def _begin(self, request: web.Request) -> tuple[dict, web.Response | None]:
        calls, headers, b = self.calls, self.headers, self.behaviour
        raw = await request.read()
        if b.delay_s:
            await asyncio.sleep(b.delay_s)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}, _error(400, "The request body is not valid JSON.")
        calls.append((request.path, body))
        headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.check_key and not (request.headers.get("x-api-key") or request.headers.get("Authorization")):
            return body, _error(401, "x-api-key header is required")
        if not request.headers.get("anthropic-version"):
            return body, _error(400, "anthropic-version: header is required")
        if b.fail_status is not None and (b.fail_times is None or b.fail_times > 0):
            if b.fail_times is not None:
                b.fail_times -= 1
            response = _error(b.fail_status, f"fake failure {secrets.token_hex(4)}")
            if b.fail_status in (429, 529) and b.retry_after:
                response.headers["retry-after"] = b.retry_after
            return body, response
        if self.faults is not None:
            return body, await self._early(request, body)
        return body, None

    async def _early(self, request: web.Request, body: dict) -> web.StreamResponse | None:
        """The answer to a fault that strikes before the message starts; None: answer."""
        request[FAULT] = fault = self.faults.next()
        if fault == "error_event" and body.get("stream"):
            return None  # told mid-stream
        status = {"500": 500, "429": 429, "failed": 529, "error_event": 529}.get(fault)
        if status is not None:
            response = _error(status, "Overloaded" if status == 529 else f"fake failure {secrets.token_hex(4)}")
            if status == 429:
                response.headers["retry-after"] = f"{self.faults.plan.retry_after:g}"
            return response
        if fault == "reset":
            return drop(request)
        if fault == "slow_first_byte":
            await asyncio.sleep(self.faults.plan.slow_first_byte_s)
        return None

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body, failure = await self._begin(request)
        if failure:
            return failure
        refused = _refused(body) or _unexpected_role(body, request.headers.get("anthropic-beta", ""))
        if refused:
            return _error(400, refused)
        container = body.get("container")
        container = (container or {}).get("id") if isinstance(container, dict) else container
        if container is not None and container not in self.containers:
            return _error(404, f"container {container!r} not found")
        message = self._message(body)
        if container is not None or any(str(t.get("type", "")).startswith("code_execution")
                                        for t in body.get("tools") or ()):
            if container is None:
                container = f"container_{secrets.token_hex(12)}"
                self.containers.add(container)
            message["container"] = {"id": container, "expires_at": "2099-01-01T00:00:00Z"}
        if self.behaviour.error_200:
            return web.json_response(_error_body(529, "overloaded"), dumps=dumps)
        fault = request.get(FAULT)
        if not body.get("stream"):
            if fault in ("stall", "broken"):
                return await self.faults.whole(request, orjson.dumps(message), fault)
            return web.json_response(message, dumps=dumps)
        events = self._events(message)
        if fault == "error_event":
            events = events[:self.faults.cut(len(events))] + [_error_body(529, "Overloaded")]
        return await self._stream(request, events)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body, failure = await self._begin(request)
        if failure:
            return failure
        words = len(orjson.dumps(body.get("messages", [])).split())
        return web.json_response({"input_tokens": 10 + words})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"type": "model", "id": "claude-fake-1", "display_name": "Claude Fake",
                                            "created_at": "2025-01-01T00:00:00Z"}],
                                  "has_more": False, "first_id": "claude-fake-1", "last_id": "claude-fake-1"})

    # ---- answers

    def _words(self, limit: int) -> tuple[str, bool]:
        """(the text, whether max_tokens cut it), a token being a word here."""
        if self.behaviour.answer is not None:
            return self.behaviour.answer, False
        words = [self.rng.choice(WORDS) for _ in range(self.rng.randint(*self.noise.words))]
        return " ".join(words[:limit]), len(words) > limit

    def _message(self, body: dict) -> dict:
        b = self.behaviour
        content, reason, stop = [], "end_turn", None
        if (body.get("thinking") or {}).get("type") in ("enabled", "adaptive"):
            thought, _ = self._words(10**6)
            content.append({"type": "thinking", "thinking": f"Let me think. {thought}",
                            "signature": base64.b64encode(self.rng.randbytes(48)).decode()})
        tool = _tool_asked(body)
        if tool is not None:
            content.append({"type": "tool_use", "id": f"toolu_{secrets.token_hex(12)}", "name": tool["name"],
                            "input": self._input(tool.get("input_schema") or {})})
            reason = "tool_use"
        else:
            text, cut = self._words(body.get("max_tokens", 1))
            for sequence in body.get("stop_sequences") or ():
                at = text.find(sequence)
                if at >= 0:
                    text, reason, stop, cut = text[:at], "stop_sequence", sequence, False
                    break
            if cut:
                reason = "max_tokens"
            content.append({"type": "text", "text": text})
        if b.unfinished:
            reason = None
        elif b.stop_reason is not None:
            reason = b.stop_reason
        output = sum(len(str(block.get("text") or block.get("thinking") or block.get("input")).split())
                     for block in content)
        return {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
                "model": f"{body['model']}-fake-0001", "content": content, "stop_reason": reason,
                "stop_sequence": stop, "usage": {"input_tokens": 11, "cache_creation_input_tokens": 0,
                                                 "cache_read_input_tokens": 0, "output_tokens": output}}

    def _input(self, schema: dict) -> dict:
        """Arguments that fit a simple object schema, new on every call, unless told to break it."""
        if self.behaviour.invalid_input_times > 0:
            self.behaviour.invalid_input_times -= 1
            return {"unexpected": self.rng.random()}
        out = {}
        for name, spec in (schema.get("properties") or {}).items():
            kind = spec.get("type") if isinstance(spec, dict) else None
            if "enum" in spec:
                out[name] = self.rng.choice(spec["enum"])
            elif kind == "integer":
                out[name] = self.rng.randint(0, 1000)
            elif kind == "number":
                out[name] = self.rng.random()
            elif kind == "boolean":
                out[name] = self.rng.random() < 0.5
            else:
                out[name] = self.rng.choice(WORDS)
        return out

    def _pieces(self, text: str) -> list[str]:
        pieces, at = [], 0
        while at < len(text):
            step = self.rng.randint(*self.noise.chunk_chars)
            pieces.append(text[at:at + step])
            at += step
        return pieces

    def _events(self, message: dict) -> list[dict]:
        """The stream of `message`, cut as the provider cuts one, pings included."""
        start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {**message["usage"], "output_tokens": 1}}
        events: list[dict] = [{"type": "message_start", "message": start}, {"type": "ping"}]
        for index, block in enumerate(message["content"]):
            kind = block["type"]
            if kind == "text":
                opened, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": p}
                                                                for p in self._pieces(block["text"])]
            elif kind == "thinking":
                opened = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": p} for p in self._pieces(block["thinking"])]
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
            else:
                opened = {**block, "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": p}
                          for p in self._pieces(orjson.dumps(block["input"]).decode())]
            events.append({"type": "content_block_start", "index": index, "content_block": opened})
            for delta in deltas:
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
                if self.rng.random() < 0.1:
                    events.append({"type": "ping"})
            events.append({"type": "content_block_stop", "index": index})
        if message["stop_reason"] is not None:
            events.append({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                                              "stop_sequence": message["stop_sequence"]},
                           "usage": {"output_tokens": message["usage"]["output_tokens"]}})
        events.append({"type": "message_stop"})
        b = self.behaviour
        if b.error_after is not None:
            events = events[:b.error_after] + [_error_body(529, "Overloaded")]
        return events

    async def _stream(self, request: web.Request, events: list[dict]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        cut, stall_s = self.behaviour.break_stream_after, None
        fault = request.get(FAULT)
        if fault in ("stall", "broken"):
            cut = self.faults.cut(len(events))
            stall_s = self.faults.plan.stall_s if fault == "stall" else None
        wire = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events[:cut])
        await write_scattered(response, wire, self.rng, self.behaviour.chunk_delay_s, self.behaviour.pace_s)
        if cut is not None:
            if stall_s is not None:
                await asyncio.sleep(stall_s)
            if request.transport is not None:
                request.transport.close()  # a dropped connection, not a clean end
            return response
        await response.write_eof()
        self.stream_ends.append(time.monotonic())
        return response


def _tool_asked(body: dict) -> dict | None:
    """The tool the model uses: the one tool_choice names, or the first with tool_choice "any"."""
    tools = [t for t in body.get("tools") or () if isinstance(t, dict) and "input_schema" in t]
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool":
        return next((t for t in tools if t.get("name") == choice.get("name")), None)
    if choice.get("type") == "any" and tools:
        return tools[0]
    return None


def _refused(body: dict) -> str | None:
    """Why the provider refuses this request's parameters, in its own words; None if it takes them."""
    model = str(body.get("model", ""))
    extra = sorted(set(body) - FIELDS)
    if extra:
        return f"{extra[0]}: Extra inputs are not permitted"
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    sampled = [p for p in ("temperature", "top_p", "top_k") if p in body]
    if sampled and any(fnmatchcase(model, glob) for glob in NO_SAMPLING):
        return f"`{sampled[0]}` is deprecated for this model."
    if "temperature" in body and "top_p" in body and any(fnmatchcase(model, g) for g in ONE_OF_TEMPERATURE_TOP_P):
        return "`temperature` and `top_p` cannot both be specified for this model. Please use only one."
    if (body.get("thinking") or {}).get("type") in ("enabled", "adaptive"):
        if body.get("temperature", 1) != 1:
            return "`temperature` may only be set to 1 when thinking is enabled."
        if "top_k" in body:
            return "`top_k` is not supported while thinking is enabled."
        if body.get("top_p", 1) < 0.95:
            return "`top_p` must be between 0.95 and 1 while thinking is enabled."
    return None


def _unexpected_role(body: dict, betas: str) -> str | None:
    """A "system" message needs the mid-conversation-system beta (Claude Code sends one)."""
    if "mid-conversation-system-" in betas:
        return None
    for i, message in enumerate(body.get("messages") or ()):
        if isinstance(message, dict) and message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
    return None


def _error_body(status: int, message: str) -> dict:
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": f"req_{secrets.token_hex(8)}"}


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(_error_body(status, message)), content_type="application/json")


def main() -> None:
    serve(__doc__.splitlines()[0], 9001, lambda noise: FakeAnthropic(noise, check_key=False).app())


if __name__ == "__main__":
    main()
