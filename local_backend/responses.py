"""Turn one request's engine events into an OpenAI response: a JSON body, or server-sent
events whose chunking is a function of the tokens alone (one chunk per token that
released text), so a stream and its non-streaming twin carry the same text and logprobs."""
from __future__ import annotations

import contextlib
import secrets
import time

import orjson
from aiohttp import web

from local_backend.engine.llm_engine import Engine, Event
from local_backend.protocol import APIError
from local_backend.sampling_params import SamplingParams
from local_backend.text_stream import TextStream

DETOKENIZE_CONTEXT = 6   # prompt tokens decoded ahead of the first generated one


def json_response(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


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

    def __init__(self, request: web.Request, engine: Engine, model_name: str, req, prompt: list[int],
                 params: SamplingParams):
        self.request, self.engine, self.model_name = request, engine, model_name
        self.req, self.prompt, self.params = req, prompt, params
        self.id = self.id_prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.gen = Generation(engine, prompt, req.stop_list())

    def envelope(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name,
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

    def logprobs(self, logprob_events: list[Event] | None) -> dict | None:
        if logprob_events is None:
            return None
        return {"content": [chat_logprob(self.gen, e) for e in logprob_events]}

    def choice(self, text: str, logprob_events: list[Event] | None) -> dict:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": self.logprobs(logprob_events), "finish_reason": self.gen.finish_reason}

    def first_chunk(self) -> dict:
        return {**self.envelope(self.object_chunk),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}]}

    def chunk(self, delta: str, logprob_events, finish_reason) -> dict:
        return {**self.envelope(self.object_chunk),
                "choices": [{"index": 0, "delta": {"content": delta} if delta else {},
                             "logprobs": self.logprobs(logprob_events), "finish_reason": finish_reason}]}


class CompletionHandler(Handler):
    object_full, object_chunk, id_prefix = "text_completion", "text_completion", "cmpl-"

    def logprobs(self, logprob_events: list[Event] | None) -> dict | None:
        return None if logprob_events is None else completion_logprobs(self.gen, logprob_events)

    def choice(self, text: str, logprob_events: list[Event] | None) -> dict:
        return {"index": 0, "text": text, "logprobs": self.logprobs(logprob_events),
                "finish_reason": self.gen.finish_reason}

    def first_chunk(self) -> None:
        return None

    def chunk(self, delta: str, logprob_events, finish_reason) -> dict:
        return {**self.envelope(self.object_chunk), "choices": [
            {"index": 0, "text": delta, "logprobs": self.logprobs(logprob_events), "finish_reason": finish_reason}]}


async def respond(handler: Handler):
    return await (handler.stream() if handler.req.stream else handler.full())
