"""Turn one request's engine events into an OpenAI response: a JSON body, or server-sent
events (a chunk per token that released text, or one for all a stream that fell behind has
queued). Both concatenate the same text and logprobs, a function of the tokens alone, so a
stream and its non-streaming twin carry the same answer."""
from __future__ import annotations

import contextlib
import functools
import secrets
import time

import orjson
from aiohttp import web

from local_backend.engine.client import EngineClient
from local_backend import tool_calls
from local_backend.engine.messages import Event, Sample
from local_backend.protocol import APIError
from local_backend.sampling_params import SamplingParams
from local_backend.text_stream import TextStream

DETOKENIZE_CONTEXT = 6   # prompt tokens decoded ahead of the first generated one
# Tokens a request answered in one body reads at a time. A stop string is then seen up to
# this many tokens late: the body is the same, and the sequence runs at most that much longer.
BODY_BATCH = 16


def json_response(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


async def events(engine: EngineClient, prompt: list[int], params: SamplingParams, batch: int = 1):
    """The engine's events for one request, each with whether more arrived with it, read `batch`
    at a time (or fewer, with the last); aborts the sequence if the consumer leaves early."""
    request_id, mailbox = engine.submit(prompt, params, batch)
    done = False
    try:
        while True:
            arrived = await mailbox.take()
            for i, event in enumerate(arrived, 1):
                if event.error:
                    raise APIError(500, event.error, type="server_error")
                yield event, i < len(arrived)
                if event.finish_reason:
                    done = True
                    return
    finally:
        if not done:
            engine.abort(request_id)


class Generation:
    """One request's progress: its text stream, how many tokens it consumed, why it ended."""

    def __init__(self, engine: EngineClient, prompt: list[int], stops: list[str]):
        tok = engine.tokenizer
        self.token_text = tok.token_text
        self.text = TextStream(tok.decode, stops, context=prompt[-DETOKENIZE_CONTEXT:])
        self.tokens = 0
        self.finish_reason: str | None = None

    def advance(self, event: Event) -> str:
        """Consume one event; return the new text. Sets finish_reason when done."""
        delta = ""
        if event.sample is not None:
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


def completion_logprobs(gen: Generation, entries: list[Event], prompt: list[int] = (),
                        prompt_entries: list[Sample] = (), k: int = 0, start: int = 0, as_ids: bool = False) -> dict:
    """OpenAI's legacy logprobs; with echo, the prompt's tokens lead (the first has no logprob).
    as_ids (vLLM's return_tokens_as_token_ids) names each token "token_id:{id}"."""
    name = (lambda t: f"token_id:{t}") if as_ids else gen.token_text
    samples = [None] * (len(prompt) - len(prompt_entries)) + list(prompt_entries) + [e.sample for e in entries]
    ids = list(prompt) + [e.sample.token for e in entries]
    texts = [gen.token_text(t) for t in ids]
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {"tokens": [name(t) for t in ids] if as_ids else texts, "token_logprobs": [s and s.logprob for s in samples],
            "top_logprobs": [s and {name(t): lp for t, lp in s.top[:k]} for s in samples],
            "text_offset": offsets}


def vllm_prompt_logprobs(gen: Generation, prompt: list[int], entries: list[Sample], k: int) -> list:
    """vLLM's `prompt_logprobs`: None for the first token, then {id: {logprob, rank, decoded_token}}
    holding the prompt token and the k likeliest."""
    out = [None] * (len(prompt) - len(entries))
    for s in entries:
        ranked = {t: (lp, rank) for rank, (t, lp) in enumerate(s.top[:k], 1)}
        ranked.setdefault(s.token, (s.logprob, s.rank))
        out.append({str(t): {"logprob": lp, "rank": rank, "decoded_token": gen.token_text(t)}
                    for t, (lp, rank) in ranked.items()})
    return out


class Handler:
    """The shape shared by both endpoints; subclasses say how a choice is written."""
    object_full: str
    object_chunk: str
    id_prefix: str

    def __init__(self, request: web.Request, engine: EngineClient, model_name: str, req, prompt: list[int],
                 params: SamplingParams):
        self.request, self.engine, self.model_name = request, engine, model_name
        self.req, self.prompt, self.params = req, prompt, params
        self.id = self.id_prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.gen = Generation(engine, prompt, req.stop_list())
        self.prompt_entries: list[Sample] = []   # the prompt's logprobs, when asked, from the first event
        self._envelopes: dict[str, dict] = {}

    def envelope(self, obj: str) -> dict:
        """The fields every body or chunk of this object type shares, built once: a stream sends a
        chunk per token. Callers copy it into their body."""
        body = self._envelopes.get(obj)
        if body is None:
            body = self._envelopes[obj] = {
                "id": self.id, "object": obj, "created": self.created, "model": self.model_name,
                "system_fingerprint": self.engine.info.fingerprint, "seed": self.params.seed}
            if self.params.defaults:   # the sampling parameters the model's generation_config.json supplied
                body["sampling_defaults"] = dict(self.params.defaults)
        return body

    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt), "completion_tokens": self.gen.tokens,
                "total_tokens": len(self.prompt) + self.gen.tokens}

    def headers(self) -> dict:
        return {"x-detgate-seed": str(self.params.seed)}

    async def full(self) -> web.Response:
        text, logprob_events = [], []
        async with contextlib.aclosing(events(self.engine, self.prompt, self.params, BODY_BATCH)) as stream:
            async for event, _ in stream:
                self.prompt_entries = event.prompt_logprobs or self.prompt_entries
                text.append(self.gen.advance(event))
                if event.sample is not None:
                    logprob_events.append(event)
                if self.gen.finish_reason:
                    break
        choice = self.choice("".join(text), logprob_events if self.params.logprobs is not None else None)
        body = {**self.envelope(self.object_full), "choices": [choice], **self.extra(), "usage": self.usage()}
        return json_response(body, headers=self.headers())

    def extra(self) -> dict:
        """Response-level fields beside the choices."""
        return {}

    async def stream(self) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", **self.headers()})
        await response.prepare(self.request)
        want_logprobs = self.params.logprobs is not None
        # Tokens not yet sent: their text is held back (a partial character, a possible stop
        # string), or more tokens are already queued behind them. A handler that has fallen
        # behind the engine (it serves hundreds of streams at once) then catches
        # up with one write for what is queued instead of one per token.
        pending: list[Event] = []
        text = ""
        first = self.first_chunk()
        if first is not None:
            await self.send(response, first)
        try:
            async with contextlib.aclosing(events(self.engine, self.prompt, self.params)) as stream:
                async for event, more in stream:
                    if event.prompt_logprobs is not None:
                        self.prompt_entries = event.prompt_logprobs
                    if self.gen.tokens == 0:
                        lead = self.lead_chunk()
                        if lead is not None:
                            await self.send(response, lead)
                    text += self.gen.advance(event)
                    if event.sample is not None:
                        pending.append(event)
                    if text and (not more or self.gen.finish_reason):
                        await self.send(response, self.chunk(text, pending if want_logprobs else None, None))
                        text, pending = "", []
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

    def lead_chunk(self) -> dict | None:
        """A chunk sent once the first event is in, before any generated text (the echoed prompt)."""
        return None

    async def send(self, response: web.StreamResponse, body: dict) -> None:
        await response.write(b"data: " + orjson.dumps(body) + b"\n\n")


class ChatHandler(Handler):
    """A chat answer; with tools, the calls in it (tool_calls.py) become OpenAI tool_calls, and a
    stream sends text as content only up to where a call may begin, the calls at the end."""
    object_full, object_chunk, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def __init__(self, *args, tool_kind: str | None = None):
        super().__init__(*args)
        self.tool_kind = tool_kind
        self.held = ""   # streamed text not yet sent: a tool call may have begun in it
        self.sent = ""   # streamed text sent as content

    def logprobs(self, logprob_events: list[Event] | None) -> dict | None:
        if logprob_events is None:
            return None
        return {"content": [chat_logprob(self.gen, e) for e in logprob_events]}

    def message(self, text: str) -> tuple[dict, str | None]:
        """The message (or delta) an answer's text makes, and the finish reason it implies."""
        reason = self.gen.finish_reason
        if self.tool_kind is None:
            return {"content": text}, reason
        content, calls = tool_calls.parse(self.tool_kind, text)
        if not calls:
            return {"content": text}, reason
        digest = tool_calls.prompt_digest(self.prompt)
        return {"content": content or None, "tool_calls": [
            {"id": tool_calls.call_id(self.params.seed, digest, i), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]}, \
            "tool_calls" if reason == "stop" else reason

    def choice(self, text: str, logprob_events: list[Event] | None) -> dict:
        message, reason = self.message(text)
        return {"index": 0, "message": {"role": "assistant", **message},
                "logprobs": self.logprobs(logprob_events), "finish_reason": reason}

    def first_chunk(self) -> dict:
        return {**self.envelope(self.object_chunk),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}]}

    def extra(self) -> dict:
        k = self.req.prompt_logprobs
        return {} if k is None else {"prompt_logprobs": vllm_prompt_logprobs(self.gen, self.prompt,
                                                                             self.prompt_entries, k)}

    def chunk(self, delta: str, logprob_events, finish_reason) -> dict:
        if self.tool_kind is not None:
            delta, finish_reason = self.tool_delta(delta, finish_reason)
        else:
            delta = {"content": delta} if delta else {}
        return {**self.envelope(self.object_chunk),
                "choices": [{"index": 0, "delta": delta, "logprobs": self.logprobs(logprob_events),
                             "finish_reason": finish_reason}]}

    def tool_delta(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The delta of a stream that may call tools: text while no call can have begun, the rest
        parsed once the answer is whole (the same parse as the body's)."""
        self.held += text
        if finish_reason is None:
            cut = tool_calls.may_start_call(self.tool_kind, self.held)
            sent, self.held = self.held[:cut], self.held[cut:]
            self.sent += sent
            return ({"content": sent} if sent else {}), None
        whole = self.sent + self.held
        message, reason = self.message(whole)
        if "tool_calls" in message:
            # The content before the calls was sent already, or is sent here.
            rest = (message["content"] or "")[len(self.sent):]
            delta = {"tool_calls": [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]}
            return ({"content": rest, **delta} if rest else delta), reason
        return ({"content": self.held} if self.held else {}), reason


class CompletionHandler(Handler):
    object_full, object_chunk, id_prefix = "text_completion", "text_completion", "cmpl-"

    def logprobs(self, logprob_events: list[Event] | None, echo: bool = False) -> dict | None:
        if logprob_events is None:
            return None
        as_ids = bool(self.req.return_tokens_as_token_ids)
        if echo:
            return completion_logprobs(self.gen, logprob_events, self.prompt, self.prompt_entries, self.req.logprobs,
                                       as_ids=as_ids)
        start = len(self.echo_text) if self.req.echo else 0
        return completion_logprobs(self.gen, logprob_events, k=self.req.logprobs, start=start, as_ids=as_ids)

    @functools.cached_property
    def echo_text(self) -> str:
        """The prompt as echoed (a chunk's logprobs need its length: decoded once, not per token)."""
        if isinstance(self.req.prompt, str):
            return self.req.prompt
        return self.engine.tokenizer.tok.decode(self.prompt, skip_special_tokens=False)

    def choice(self, text: str, logprob_events: list[Event] | None) -> dict:
        choice = {"index": 0, "text": self.echo_text + text if self.req.echo else text,
                  "logprobs": self.logprobs(logprob_events, echo=bool(self.req.echo)),
                  "finish_reason": self.gen.finish_reason}
        if self.req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(self.gen, self.prompt, self.prompt_entries,
                                                             self.req.prompt_logprobs)
        return choice

    def first_chunk(self) -> None:
        return None

    def lead_chunk(self) -> dict | None:
        if not self.req.echo and self.req.prompt_logprobs is None:
            return None
        choice = {"index": 0, "text": self.echo_text if self.req.echo else "",
                  "logprobs": self.logprobs([], echo=True) if self.req.echo and self.params.logprobs is not None
                  else None, "finish_reason": None}
        if self.req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(self.gen, self.prompt, self.prompt_entries,
                                                             self.req.prompt_logprobs)
        return {**self.envelope(self.object_chunk), "choices": [choice]}

    def chunk(self, delta: str, logprob_events, finish_reason) -> dict:
        return {**self.envelope(self.object_chunk), "choices": [
            {"index": 0, "text": delta, "logprobs": self.logprobs(logprob_events), "finish_reason": finish_reason}]}


async def respond(handler: Handler):
    return await (handler.stream() if handler.req.stream else handler.full())
