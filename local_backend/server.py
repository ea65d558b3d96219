"""The OpenAI-compatible HTTP face of the engine (aiohttp).

Handlers validate, tokenize, submit token ids to the engine thread and turn its
per-token events into a response: one JSON body, or server-sent events whose chunking
is a function of the tokens alone. Every response names the seed that produced it
(the `seed` field and the x-detgate-seed header), so any answer can be replayed.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from local_backend.engine.llm_engine import Engine, Event
from local_backend.protocol import APIError, ChatRequest, CompletionRequest, parse
from local_backend.sampling_params import SamplingParams
from local_backend.text_stream import TextStream
from local_backend.tokenizer import TemplateError

log = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", Engine)
MODEL_NAME = web.AppKey("model_name", str)
MAX_BODY_BYTES = 16 << 20
DETOKENIZE_CONTEXT = 6   # prompt tokens decoded ahead of the first generated one


def new_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1   # non-negative and fits int64


def json_response(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


@web.middleware
async def errors(request: web.Request, handler):
    """Every failure leaves as an OpenAI-shaped error, and every request is counted."""
    metrics = request.app[ENGINE].metrics
    try:
        response = await handler(request)
    except APIError as e:
        response = json_response(e.body(), e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        response = json_response(APIError(e.status, e.reason, type=kind).body(), e.status)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        response = json_response(APIError(500, "internal server error", type="server_error").body(), 500)
    if request.path.startswith("/v1/"):
        metrics.requests.labels(status=str(response.status)).inc()
    return response


async def read_body(request: web.Request):
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


def check_model(request: web.Request, model: str) -> None:
    served = request.app[MODEL_NAME]
    if model != served:
        raise APIError(404, f"the model '{model}' does not exist; this server serves '{served}'",
                       param="model", code="model_not_found")


def sampling_params(req, engine: Engine, prompt_len: int, max_tokens: int | None, logprobs: int | None):
    if max_tokens is None:
        max_tokens = engine.max_model_len - prompt_len
    problem = engine.capacity_error(prompt_len, max_tokens)
    if problem:
        raise APIError(400, problem, param="messages" if isinstance(req, ChatRequest) else "prompt",
                       code="context_length_exceeded")
    top_k = req.top_k or 0
    return SamplingParams(
        seed=new_seed() if req.seed is None else req.seed,
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if top_k < 0 else top_k,
        logprobs=logprobs,
        ignore_eos=bool(req.ignore_eos))


async def events(engine: Engine, prompt: list[int], params: SamplingParams):
    """The engine's events for one request; aborts the sequence if the consumer leaves early."""
    seq_id, sink = engine.submit(prompt, params)
    done = False
    try:
        while True:
            event: Event = await sink.get()
            if event.error:
                raise APIError(500, event.error, type="server_error")
            yield event
            if event.finish_reason:
                done = True
                return
    finally:
        if not done:
            engine.abort(seq_id)


class Generation:
    """One request's progress: its text stream, how many tokens it consumed, why it ended."""

    def __init__(self, engine: Engine, prompt: list[int], stops: list[str]):
        tok = engine.tokenizer
        self.token_text = tok.token_text
        self.text = TextStream(tok.decode, stops, context=prompt[-DETOKENIZE_CONTEXT:])
        self.tokens = 0
        self.finish_reason: str | None = None

    def advance(self, event: Event) -> str:
        """Consume one event; return the new text. Sets finish_reason when done."""
        self.tokens += 1
        delta = self.text.push(event.sample.token)
        if self.text.stopped:
            self.finish_reason = "stop"
        elif event.finish_reason:
            delta += self.text.flush()
            self.finish_reason = event.finish_reason
        return delta


def chat_logprob(gen: Generation, event: Event) -> dict:
    s = event.sample

    def entry(token_id, lp):
        text = gen.token_text(token_id)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    return {**entry(s.token, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}


def completion_logprobs(gen: Generation, entries: list[Event]) -> dict:
    tokens = [gen.token_text(e.sample.token) for e in entries]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [e.sample.logprob for e in entries],
            "top_logprobs": [{gen.token_text(t): lp for t, lp in e.sample.top} for e in entries],
            "text_offset": offsets}


class Handler:
    """The shape shared by both endpoints; subclasses say how a choice is written."""
    object_full: str
    object_chunk: str
    id_prefix: str

    def __init__(self, request: web.Request, engine: Engine, req, prompt: list[int], params: SamplingParams):
        self.request, self.engine, self.req, self.prompt, self.params = request, engine, req, prompt, params
        self.id = self.id_prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.gen = Generation(engine, prompt, req.stop_list())

    def envelope(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.request.app[MODEL_NAME],
                "system_fingerprint": self.engine.fingerprint, "seed": self.params.seed}

    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt), "completion_tokens": self.gen.tokens,
                "total_tokens": len(self.prompt) + self.gen.tokens}

    def headers(self) -> dict:
        return {"x-detgate-seed": str(self.params.seed)}

    async def full(self) -> web.Response:
        text, logprob_events = [], []
        async with contextlib.aclosing(events(self.engine, self.prompt, self.params)) as stream:
            async for event in stream:
                text.append(self.gen.advance(event))
                logprob_events.append(event)
                if self.gen.finish_reason:
                    break
        choice = self.choice("".join(text), logprob_events if self.params.logprobs is not None else None)
        body = {**self.envelope(self.object_full), "choices": [choice], "usage": self.usage()}
        return json_response(body, headers=self.headers())

    async def stream(self) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", **self.headers()})
        await response.prepare(self.request)
        want_logprobs = self.params.logprobs is not None
        pending: list[Event] = []   # tokens whose text is still held back
        first = self.first_chunk()
        if first is not None:
            await self.send(response, first)
        try:
            async with contextlib.aclosing(events(self.engine, self.prompt, self.params)) as stream:
                async for event in stream:
                    delta = self.gen.advance(event)
                    pending.append(event)
                    if delta:
                        await self.send(response, self.chunk(delta, pending if want_logprobs else None, None))
                        pending = []
                    if self.gen.finish_reason:
                        break
        except APIError as e:
            await self.send(response, e.body())
            return response
        except ConnectionResetError:   # the client left; aclosing() has aborted its sequence
            return response
        await self.send(response, self.chunk("", pending if want_logprobs else None, self.gen.finish_reason))
        options = self.req.stream_options
        if options is not None and options.include_usage:
            await self.send(response, {**self.envelope(self.object_chunk), "choices": [], "usage": self.usage()})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def send(self, response: web.StreamResponse, body: dict) -> None:
        await response.write(b"data: " + orjson.dumps(body) + b"\n\n")


class ChatHandler(Handler):
    object_full, object_chunk, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def choice(self, text: str, logprob_events: list[Event] | None) -> dict:
        logprobs = None
        if logprob_events is not None:
            logprobs = {"content": [chat_logprob(self.gen, e) for e in logprob_events]}
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": self.gen.finish_reason}

    def first_chunk(self) -> dict:
        return {**self.envelope(self.object_chunk),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}]}

    def chunk(self, delta: str, logprob_events, finish_reason) -> dict:
        logprobs = None
        if logprob_events is not None:
            logprobs = {"content": [chat_logprob(self.gen, e) for e in logprob_events]}
        return {**self.envelope(self.object_chunk),
                "choices": [{"index": 0, "delta": {"content": delta} if delta else {},
                             "logprobs": logprobs, "finish_reason": finish_reason}]}


class CompletionHandler(Handler):
    object_full, object_chunk, id_prefix = "text_completion", "text_completion", "cmpl-"

    def choice(self, text: str, logprob_events: list[Event] | None) -> dict:
        logprobs = None if logprob_events is None else completion_logprobs(self.gen, logprob_events)
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": self.gen.finish_reason}

    def first_chunk(self) -> None:
        return None

    def chunk(self, delta: str, logprob_events, finish_reason) -> dict:
        logprobs = None if logprob_events is None else completion_logprobs(self.gen, logprob_events)
        return {**self.envelope(self.object_chunk),
                "choices": [{"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}


async def respond(handler: Handler):
    return await (handler.stream() if handler.req.stream else handler.full())


async def chat_completions(request: web.Request):
    engine = request.app[ENGINE]
    req: ChatRequest = parse(ChatRequest, await read_body(request))
    check_model(request, req.model)
    try:
        prompt = engine.tokenizer.encode_chat([m.for_template() for m in req.messages])
    except TemplateError as e:
        raise APIError(400, str(e), param="messages") from None
    max_tokens = req.max_completion_tokens or req.max_tokens
    top = req.top_logprobs or 0
    params = sampling_params(req, engine, len(prompt), max_tokens, top if req.logprobs else None)
    return await respond(ChatHandler(request, engine, req, prompt, params))


async def completions(request: web.Request):
    engine = request.app[ENGINE]
    req: CompletionRequest = parse(CompletionRequest, await read_body(request))
    check_model(request, req.model)
    if isinstance(req.prompt, str):
        prompt = engine.tokenizer.encode(req.prompt, add_special_tokens=True)
    else:
        vocab = engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        prompt = list(req.prompt)
    if not prompt:
        raise APIError(400, "the prompt is empty after tokenization", param="prompt")
    params = sampling_params(req, engine, len(prompt), req.max_tokens or 16, req.logprobs)
    return await respond(CompletionHandler(request, engine, req, prompt, params))


async def models(request: web.Request):
    name = request.app[MODEL_NAME]
    return json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "detgate",
         "system_fingerprint": request.app[ENGINE].fingerprint}]})


async def healthz(request: web.Request):
    engine = request.app[ENGINE]
    alive = engine.alive
    body = {"status": "ok" if alive else "engine stopped", "model": request.app[MODEL_NAME],
            "system_fingerprint": engine.fingerprint, "mode": engine.config.mode,
            "prefix_caching": engine.prefix_caching, "max_batch": engine.max_batch, "last_error": engine.last_error}
    return json_response(body, 200 if alive else 503)


async def metrics(request: web.Request):
    body = generate_latest(request.app[ENGINE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def engine_thread(app: web.Application):
    engine = app[ENGINE]
    engine.start()
    yield
    await asyncio.get_running_loop().run_in_executor(None, engine.stop)


def make_app(engine: Engine, model_name: str) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY_BYTES)
    app[ENGINE] = engine
    app[MODEL_NAME] = model_name
    app.cleanup_ctx.append(engine_thread)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app
