"""A fake chat provider whose *answers* are noisy in controlled ways, for votes and
schema-validated retries.

Its content is a JSON object {"answer": ..., "note": ...}: the answer is "yes", flipped to
"no" with probability `p_flip`; the note is fresh words every call, and the JSON's layout
changes from call to call, so two answers that agree are still never the same bytes
(compare them by the extractor /answer). With probability `p_invalid` the content breaks
the schema instead: truncated JSON, or an answer of the wrong type. Draws come from one
seeded generator, so a run is repeatable in distribution; like a real provider under load,
it ignores the request's seed and temperature. `by_seed` pins the answer for a request
seed, for tests that need one exact sequence of votes.

With `tool` set, it calls that tool with {"city": ...} arguments instead (an integer city
when the answer is invalid). A stream carries the same answer, cut at random places.
"""
from __future__ import annotations

import asyncio
import random
import secrets
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

WORDS = "amber basil cedar dune ember fjord grove heath iris jade kelp lotus moss nectar".split()
INVALID = "invalid"  # a by_seed value: the content breaks the schema


@dataclass
class NoisyUpstream:
    p_flip: float = 0.0
    p_invalid: float = 0.0
    seed: int = 0
    tool: str | None = None
    by_seed: dict[int, str] = field(default_factory=dict)  # request seed -> "yes" | "no" | INVALID | any answer
    delay_s: float = 0.0
    fail_status: int | None = None
    calls: list[dict] = field(default_factory=list)  # request bodies, in arrival order
    sent: list[dict] = field(default_factory=list)  # the messages answered, in the same order

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    def _draw(self, request_seed: object) -> str:
        if isinstance(request_seed, int) and request_seed in self.by_seed:
            return self.by_seed[request_seed]
        if self.rng.random() < self.p_invalid:
            return INVALID
        return "no" if self.rng.random() < self.p_flip else "yes"

    def _content(self, answer: str) -> str:
        note = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(2, 6)))
        if answer == INVALID:
            if self.rng.random() < 0.5:
                return '{"answer": "ye'  # cut off mid-string
            return orjson.dumps({"answer": 42, "note": note}).decode()
        obj = {"answer": answer, "note": note} if self.rng.random() < 0.5 else {"note": note, "answer": answer}
        text = orjson.dumps(obj, option=orjson.OPT_INDENT_2 if self.rng.random() < 0.5 else 0).decode()
        return text if self.rng.random() < 0.5 else f"  {text}\n"

    def _message(self, answer: str) -> dict:
        if self.tool is None:
            return {"role": "assistant", "content": self._content(answer)}
        city = 7 if answer == INVALID else {"yes": "Paris", "no": "Lyon"}.get(answer, answer)
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{secrets.token_hex(6)}", "type": "function",
            "function": {"name": self.tool, "arguments": orjson.dumps({"city": city}).decode()}}]}

    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.calls.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_status is not None:
            error = {"error": {"message": f"noisy failure {secrets.token_hex(4)}", "type": "server_error",
                               "param": None, "code": "noisy"}}
            return web.json_response(error, status=self.fail_status)
        message = self._message(self._draw(body.get("seed")))
        self.sent.append(message)
        head = {"id": f"chatcmpl-{secrets.token_hex(12)}", "created": int(time.time()) + self.rng.randint(0, 10**6),
                "model": f"{body['model']}-noisy",
                "system_fingerprint": "fp_noisy_0001"}  # steady: drift is not what this fake is for
        finish = "tool_calls" if self.tool else "stop"
        if body.get("stream"):
            return await self._stream(request, head, message, finish)
        return web.json_response({
            **head, "object": "chat.completion", "choices": [{"index": 0, "message": message, "logprobs": None,
                                                              "finish_reason": finish}],
            "usage": {"prompt_tokens": 9, "completion_tokens": self.rng.randint(5, 30), "total_tokens": 40}})

    async def _stream(self, request: web.Request, head: dict, message: dict, finish: str) -> web.StreamResponse:
        """The message as OpenAI streams it: its content or its call's arguments in pieces of random size."""
        head = {**head, "object": "chat.completion.chunk"}
        deltas: list[dict] = [{"role": "assistant", "content": "" if self.tool is None else None}]
        if self.tool is None:
            deltas += [{"content": piece} for piece in self._pieces(message["content"])]
        else:
            call = message["tool_calls"][0]
            deltas.append({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": ""}}]})
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                       for piece in self._pieces(call["function"]["arguments"])]
        chunks = [{**head, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]}
                  for d in deltas]
        chunks.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _pieces(self, text: str) -> list[str]:
        cuts = sorted(self.rng.sample(range(1, len(text)), min(len(text) - 1, self.rng.randint(1, 6))))
        return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
