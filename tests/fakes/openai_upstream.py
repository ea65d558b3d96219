"""A fake OpenAI-compatible provider that is as nondeterministic as a real one.

Every call gets a new id, created time, fingerprint and text, and every stream is cut into
differently sized chunks, so anything a cache gets wrong shows up as differing bytes.
It can be told to fail, hang, or break a stream off, and it records what it was sent.

Run alone (for benchmarks): python tests/fakes/openai_upstream.py --port 9000
"""
from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import orjson
from aiohttp import web

from fakes.loopback import write_scattered

if __package__ in (None, ""):  # run as a script (the benchmarks): make `fakes` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes import openai_answers as answers  # noqa: E402
from fakes import responses_upstream

if TYPE_CHECKING:
    from fakes.faults import Faults

from fakes.faults import FAULT  # noqa: E402

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


@dataclass
class Noise:
    """How the fake varies its answers. Defaults vary everything; `words=(n, n)` with a seeded
    rng still varies ids and chunking, so a test can aim at one kind of difference."""

    words: tuple[int, int] = (5, 40)  # answer length range
    chunk_chars: tuple[int, int] = (1, 12)  # stream chunk size range
    seed: int | None = None


@dataclass
class Behaviour:
    """What the next calls do; tests change these between requests."""

    fail_status: int | None = None  # answer every call with this status
    fail_times: int | None = None  # ...only this many times (None: until reset)
    delay_s: float = 0.0  # before answering
    chunk_delay_s: float = 0.0  # between stream chunks
    pace_s: float = 0.0  # spread each stream over about this long (a slow model), chat and Responses alike
    break_stream_after: int | None = None  # close a stream after this many chunks, without [DONE]
    stall_stream_after: int | None = None  # go silent after this many chunks (for `stall_s`), then drop
    stall_s: float = 30.0
    retry_after: str | None = "0"  # the Retry-After header of a 429
    error_echoes_key: bool = False  # put the caller's Authorization in error messages, as some providers do
    # The model build answering: steady like a real provider's, until a test swaps it (drift).
    fingerprint: str = "fp_fake_0001"
    # Answer every call with this text, as a real model does a simple prompt at temperature 0
    # (ids, timestamps and stream chunking still vary); None: random words.
    answer: str | None = None
    announce_profile: str | None = None  # answer /v1/models as a detgate backend announcing this profile
    models_status: int | None = None  # answer /v1/models with this error status (a backend still starting)

    # How answers end, on every route (issue 22 §3): another finish_reason than the route's
    # usual one ("length", "content_filter", vLLM's "abort"), or `unfinished`: choice 0 never
    # finishes (null in a body; a stream reaches [DONE] without its finish).
    finish: str | None = None
    unfinished: bool = False
    error_200: bool = False  # a 200 whose body is an error object (a stream: an error event, then [DONE])
    error_after: int | None = None  # a stream sends an error event after this many chunks, then [DONE]
    empty: bool = False  # a 200 without choices (embeddings: without data); a stream of its usage chunk only
    refuse: bool = False  # chat answers are refusals, as a model declining a structured output


@dataclass
class FakeUpstream:
    noise: Noise = field(default_factory=Noise)
    behaviour: Behaviour = field(default_factory=Behaviour)
    calls: list[tuple[str, dict]] = field(default_factory=list)  # (path, body)
    authorizations: list[str | None] = field(default_factory=list)  # each call's Authorization header
    traceparents: list[tuple[str | None, str | None]] = field(default_factory=list)  # each call's W3C trace context
    started: int = 0  # calls that began, including ones still running
    faults: Faults | None = None  # fakes/faults.py: a fault per call (500, 429, resets, stalls, ...)
    stream_ends: list[float] = field(default_factory=list)  # time.monotonic() as each whole stream was sent

    def __post_init__(self) -> None:
        self.rng = random.Random(self.noise.seed)

    def reset(self) -> None:
        # New objects, not cleared ones: a call still sleeping from an earlier test (one left
        # hanging on purpose) records into, and takes its behaviour from, that test's.
        self.behaviour = Behaviour()
        self.calls = []
        self.authorizations = []
        self.traceparents = []
        self.started = 0
        self.stream_ends = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/v1/echo/{tail:.*}", self._echo)
        responses_upstream.mount(app, self)
        return app

    async def _begin(self, request: web.Request) -> tuple[dict, web.Response | None]:
        self.started += 1
        calls, b = self.calls, self.behaviour
        body = orjson.loads(await request.read())
        if b.delay_s:
            await asyncio.sleep(b.delay_s)
        calls.append((request.path, body))
        self.authorizations.append(request.headers.get("Authorization"))
        self.traceparents.append((request.headers.get("traceparent"), request.headers.get("tracestate")))
        refused = _refused(body)
        if refused is not None:
            return body, web.Response(status=400, body=orjson.dumps(refused), content_type="application/json")
        if b.fail_status is not None and (b.fail_times is None or b.fail_times > 0):
            if b.fail_times is not None:
                b.fail_times -= 1
            echoed = f" (key: {request.headers.get('Authorization')})" if b.error_echoes_key else ""
            error = {"error": {"message": f"fake failure {secrets.token_hex(4)}{echoed}", "type": "server_error",
                               "param": None, "code": "fake"}}
            return body, web.Response(status=b.fail_status, body=orjson.dumps(error), content_type="application/json",
                                      headers={"retry-after": b.retry_after} if b.fail_status == 429 and b.retry_after else None)
        if self.faults is not None:
            request[FAULT] = fault = self.faults.next()
            early = await self.faults.early(request, fault)
            if early is not None:
                return body, early
        return body, None

    async def _whole(self, request: web.Request, payload: dict) -> web.StreamResponse:
        """A non-stream answer, unless a fault hangs it or cuts it short."""
        fault = request.get(FAULT)
        if fault in ("stall", "broken"):
            return await self.faults.whole(request, orjson.dumps(payload), fault)
        return web.json_response(payload, dumps=dumps)

    def _text(self) -> str:
        if self.behaviour.answer is not None:
            return self.behaviour.answer
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(*self.noise.words)))

    def _head(self, prefix: str, obj: str, model: str) -> dict:
        return {"id": f"{prefix}-{secrets.token_hex(12)}", "object": obj,
                "created": int(time.time()) + self.rng.randint(0, 10**6), "model": f"{model}-fake-0001",
                "system_fingerprint": self.behaviour.fingerprint}

    def _usage(self, text: str) -> dict:
        completion = len(text.split())
        return {"prompt_tokens": 7, "completion_tokens": completion, "total_tokens": 7 + completion}

    def _pieces(self, text: str) -> list[str]:
        pieces, at = [], 0
        while at < len(text):
            step = self.rng.randint(*self.noise.chunk_chars)
            pieces.append(text[at:at + step])
            at += step
        return pieces

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, failure = await self._begin(request)
        if failure:
            return failure
        kind, tools = answers.kind_asked(body)
        if self.behaviour.refuse and kind == "text":
            kind = "refusal"
        top = (body.get("top_logprobs") or 0) if body.get("logprobs") else None
        usual = "tool_calls" if kind == "tools" else "stop"
        found = [self._choice(i, usual, kind=kind, tools=tools, logprobs=top) for i in range(body.get("n") or 1)]
        head = self._head("chatcmpl", "chat.completion", body["model"])
        if "service_tier" in body:  # the tier that answered, as OpenAI reports it in the body and every chunk
            head["service_tier"] = body["service_tier"] if body["service_tier"] != "auto" else "default"
        usage = self._usage(" ".join(c.text for c in found))
        if not body.get("stream"):
            return await self._whole(request, self._body(head, [answers.chat_message(self.rng, c) for c in found], usage))
        head["object"] = "chat.completion.chunk"
        parts = self._interleave([answers.chat_parts(self.rng, c, self._pieces) for c in found])
        return await self._stream(request, self._chunks(head, parts, body, usage))

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body, failure = await self._begin(request)
        if failure:
            return failure
        n, top = body.get("n") or 1, body.get("logprobs")
        found = []
        # Choice j of prompt p is numbered p * n + j, as OpenAI and vLLM number them.
        for p, prompt in enumerate(_prompts(body["prompt"])):
            for j in range(n):
                choice = self._choice(p * n + j, "length", logprobs=top)
                if body.get("echo") and isinstance(prompt, str):
                    choice.text = prompt + choice.text
                found.append(choice)
        head = self._head("cmpl", "text_completion", body["model"])
        usage = self._usage(" ".join(c.text for c in found))
        if not body.get("stream"):
            return await self._whole(request, self._body(head, [answers.completion_choice(self.rng, c) for c in found],
                                                         usage))
        parts = self._interleave([answers.completion_parts(self.rng, c, self._pieces) for c in found])
        return await self._stream(request, self._chunks(head, parts, body, usage))

    def _choice(self, index: int, usual: str, **kind) -> answers.Choice:
        b = self.behaviour
        finish = None if b.unfinished and index == 0 else (b.finish or usual)
        audio = self.rng.randbytes(2 * self.rng.randint(20, 300)) if kind.get("kind") == "audio" else b""
        return answers.Choice(index, self._text(), finish, audio=audio, **kind)

    def _error(self) -> dict:
        return {"error": {"message": f"fake failure {secrets.token_hex(4)}", "type": "server_error", "param": None,
                          "code": "fake"}}

    def _body(self, head: dict, choices: list[dict], usage: dict) -> dict:
        if self.behaviour.error_200:
            return self._error()
        return {**head, "choices": [] if self.behaviour.empty else choices, "usage": usage}

    def _interleave(self, streams: list[list[dict]]) -> list[dict]:
        """Several choices' parts in one stream, taking turns at random, as servers send them."""
        out, streams = [], [s for s in streams if s]
        while streams:
            stream = self.rng.choice(streams)
            out.append(stream.pop(0))
            streams = [s for s in streams if s]
        return out

    def _chunks(self, head: dict, parts: list[dict], body: dict, usage: dict) -> list[dict]:
        """One chunk per choice part. With include_usage every chunk says `usage: null` and a
        last one with no choices carries the usage, as OpenAI streams it."""
        b = self.behaviour
        if b.error_200:
            return [self._error()]
        chunks = [] if b.empty else [{**head, "choices": [part]} for part in parts]
        if (body.get("stream_options") or {}).get("include_usage") is True:
            chunks = [{**chunk, "usage": None} for chunk in chunks] + [{**head, "choices": [], "usage": usage}]
        if b.error_after is not None:
            return chunks[:b.error_after] + [self._error()]
        return chunks

    async def _stream(self, request: web.Request, chunks: list[dict]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        breaking = self.behaviour.break_stream_after
        stall_s = None
        if self.behaviour.stall_stream_after is not None:
            breaking, stall_s = self.behaviour.stall_stream_after, self.behaviour.stall_s
        fault = request.get(FAULT)
        if fault in ("stall", "broken"):
            breaking = self.faults.cut(len(chunks))
            stall_s = self.faults.plan.stall_s if fault == "stall" else None
        wire = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks[:breaking])
        if breaking is None:
            wire += b"data: [DONE]\n\n"
        await write_scattered(response, wire, self.rng, self.behaviour.chunk_delay_s, self.behaviour.pace_s)
        if breaking is not None:
            if stall_s is not None:
                await asyncio.sleep(stall_s)
            if request.transport is not None:  # None: the client hung up during the stall
                request.transport.close()  # a dropped connection, not a clean end
            return response
        await response.write_eof()
        self.stream_ends.append(time.monotonic())
        return response

    async def _embeddings(self, request: web.Request) -> web.Response:
        body, failure = await self._begin(request)
        if failure:
            return failure
        inputs = body["input"] if isinstance(body["input"], list) and body["input"] and not isinstance(body["input"][0], int) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [self.rng.uniform(-1, 1) for _ in range(8)]}
                for i in range(len(inputs))]
        if self.behaviour.error_200:
            return await self._whole(request, self._error())
        return await self._whole(request, {"object": "list", "data": [] if self.behaviour.empty else data,
                                           "model": f"{body['model']}-fake-0001",
                                           "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    async def _models(self, request: web.Request) -> web.Response:
        if self.behaviour.models_status is not None:
            return web.json_response({"error": {"message": "starting", "type": "server_error"}},
                                     status=self.behaviour.models_status)
        model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}
        if self.behaviour.announce_profile is not None:
            model["detgate"] = {"profile": self.behaviour.announce_profile}  # as a detgate backend announces itself
        return web.json_response({"object": "list", "data": [model]})

    async def _echo(self, request: web.Request) -> web.Response:
        return web.json_response({"method": request.method, "path": request.path, "query": dict(request.query),
                                  "authorization": request.headers.get("Authorization"),
                                  "body": (await request.read()).decode()})


def _refused(body: dict) -> dict | None:
    """OpenAI's 400 for a sampling parameter its reasoning models do not take; None when the body is fine."""
    model = str(body.get("model", ""))
    if not model.startswith(("o1", "o3", "o4", "gpt-5")) or model.startswith("gpt-5-chat"):
        return None
    for param in ("temperature", "top_p"):
        if param in body:
            return {"error": {"message": f"Unsupported parameter: '{param}' is not supported with this model.",
                              "type": "invalid_request_error", "param": param, "code": "unsupported_parameter"}}
    return None


def _prompts(prompt) -> list:
    """A completions prompt as its list of prompts: a string, tokens, or a list of either."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return prompt
    return [prompt]


def dumps(obj) -> str:
    return orjson.dumps(obj).decode()


def serve(description: str, port: int, app_for: Callable[[Noise], web.Application]) -> None:
    """Run a fake alone (for benchmarks): --host, --port, --words (its answers' length range)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--words", type=int, nargs=2, default=(5, 40))
    args = parser.parse_args()
    web.run_app(app_for(Noise(words=tuple(args.words))), host=args.host, port=args.port, access_log=None, print=None)


def main() -> None:
    serve(__doc__.splitlines()[0], 9000, lambda noise: FakeUpstream(noise).app())


if __name__ == "__main__":
    main()
