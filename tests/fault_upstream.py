"""An OpenAI-compatible upstream over loopback that misbehaves on purpose.

Healthy answers are as nondeterministic as a real provider's: new id and text on every
call, and a stream cut into differently sized chunks each time. Faults, chosen per
request (from a script first, then at random by weight from a seeded RNG):

    ok               a normal answer
    500              an OpenAI-shaped 500 error
    429              a 429 with Retry-After (delta-seconds or an HTTP-date)
    reset            the connection is dropped before any byte is sent
    slow_first_byte  a normal answer after `slow_first_byte_s` of silence
    stall            a stream that goes silent mid-way for `stall_s`, then drops
                     (a non-stream request just hangs for `stall_s`, then drops)
    broken           the connection drops mid-body: a stream without [DONE], or a JSON
                     body shorter than its Content-Length

Refused connections are a property of the listener, not of a request: `refuse()` stops
listening (clients get ECONNREFUSED) until `accept()` listens again on the same port.

Run it alone for a load test:  python3 tests/fault_upstream.py --port 9100 --weights ok=90,500=4,429=3,broken=3
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import email.utils
import random
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

FAULTS = ("ok", "500", "429", "reset", "slow_first_byte", "stall", "broken")

_WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
          "pi rho sigma tau upsilon phi chi psi omega the a of and to in is it").split()


@dataclass
class FaultPlan:
    weights: dict[str, float] = field(default_factory=lambda: {"ok": 1.0})
    retry_after: float = 1.0  # seconds a 429 asks for
    retry_after_format: str = "seconds"  # or "date": an HTTP-date that far in the future
    slow_first_byte_s: float = 0.5
    stall_s: float = 30.0
    chunk_delay_s: float = 0.002  # upper bound of the random pause between stream chunks

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {sorted(unknown)}; known: {FAULTS}")
        if self.retry_after_format not in ("seconds", "date"):
            raise ValueError("retry_after_format is 'seconds' or 'date'")


def _error_body(message: str, type_: str, code: str | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


class FaultUpstream:
    def __init__(self, plan: FaultPlan | None = None, seed: int | None = None):
        self.plan = plan or FaultPlan()
        self.rng = random.Random(seed)
        self.script: collections.deque[str] = collections.deque()  # faults to serve first, in order
        self.served: collections.Counter[str] = collections.Counter()  # fault -> requests served with it
        self.host = "127.0.0.1"
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        return app

    async def start(self, port: int = 0) -> FaultUpstream:
        self._runner = web.AppRunner(self.app(), handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, port)
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def refuse(self) -> None:
        """Stop listening: new connections are refused until accept()."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def accept(self) -> None:
        if self._site is None:
            self._site = web.TCPSite(self._runner, self.host, self.port)
            await self._site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._site = None

    async def __aenter__(self) -> FaultUpstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- choosing and serving faults ------------------------------------------------

    def _next_fault(self) -> str:
        fault = self.script.popleft() if self.script else self.rng.choices(
            list(self.plan.weights), weights=list(self.plan.weights.values()))[0]
        self.served[fault] += 1
        return fault

    def _text(self) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(5, 40)))

    def _chunks(self, text: str) -> list[str]:
        pieces, i = [], 0
        while i < len(text):
            n = self.rng.randint(1, 12)
            pieces.append(text[i:i + n])
            i += n
        return pieces

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "text")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.Response(status=400, body=_error_body("invalid JSON", "invalid_request_error", "bad_json"),
                                content_type="application/json")
        fault = self._next_fault()
        early = await self._early_fault(request, fault)
        if early is not None:
            return early
        model = str(body.get("model", "fault-model"))
        if body.get("stream"):
            return await self._stream(request, kind, model, fault, body)
        return await self._whole(request, kind, model, fault)

    async def _early_fault(self, request: web.Request, fault: str) -> web.StreamResponse | None:
        """Faults that happen before a healthy answer starts; None means go on."""
        if fault == "500":
            return web.Response(status=500, content_type="application/json",
                                body=_error_body("the server had an error", "server_error", None))
        if fault == "429":
            return web.Response(status=429, content_type="application/json",
                                headers={"Retry-After": self._retry_after()},
                                body=_error_body("rate limit reached", "requests", "rate_limit_exceeded"))
        if fault == "reset":
            return await self._drop(request)
        if fault == "slow_first_byte":
            await asyncio.sleep(self.plan.slow_first_byte_s)
        return None

    def _retry_after(self) -> str:
        if self.plan.retry_after_format == "date":
            return email.utils.formatdate(time.time() + self.plan.retry_after, usegmt=True)
        return f"{self.plan.retry_after:g}"

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        request.transport.abort()
        # The handler must still return; aiohttp discards a response for a closed transport.
        return web.Response(status=500)

    async def _whole(self, request: web.Request, kind: str, model: str, fault: str) -> web.StreamResponse:
        if fault == "stall":
            await asyncio.sleep(self.plan.stall_s)
            return await self._drop(request)
        payload = orjson.dumps(self._completion(kind, model, self._text()))
        if fault != "broken":
            return web.Response(body=payload, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: len(payload) // 2])
        return await self._drop(request)

    def _completion(self, kind: str, model: str, text: str) -> dict:
        ident = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{self.rng.getrandbits(96):024x}"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                  if kind == "chat" else {"index": 0, "text": text, "finish_reason": "stop"})
        words = len(text.split())
        return {"id": ident, "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()), "model": model, "system_fingerprint": "fp_fault",
                "choices": [choice],
                "usage": {"prompt_tokens": 7, "completion_tokens": words, "total_tokens": 7 + words}}

    async def _stream(self, request: web.Request, kind: str, model: str, fault: str,
                      body: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        ident = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{self.rng.getrandbits(96):024x}"
        created = int(time.time())
        text = self._text()
        pieces = self._chunks(text)
        cut = self.rng.randint(1, max(1, len(pieces) - 1)) if fault in ("stall", "broken") else None

        def event(delta: dict | None, finish: str | None, content: str = "") -> bytes:
            if kind == "chat":
                choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
                obj = "chat.completion.chunk"
            else:
                choice = {"index": 0, "text": content, "finish_reason": finish}
                obj = "text_completion"
            chunk = {"id": ident, "object": obj, "created": created, "model": model,
                     "system_fingerprint": "fp_fault", "choices": [choice]}
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        if kind == "chat":
            await response.write(event({"role": "assistant", "content": ""}, None))
        for n, piece in enumerate(pieces):
            if n == cut:
                if fault == "stall":
                    await asyncio.sleep(self.plan.stall_s)
                return await self._drop(request)
            await response.write(event({"content": piece}, None, piece))
            await asyncio.sleep(self.rng.uniform(0, self.plan.chunk_delay_s))
        await response.write(event({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            words = len(text.split())
            usage = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": words,
                                              "total_tokens": 7 + words}}
            await response.write(b"data: " + orjson.dumps(usage) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        fault = self._next_fault()
        early = await self._early_fault(request, fault)
        if early is not None:
            return early
        body = orjson.loads(await request.read())
        inputs = body.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = [{"object": "embedding", "index": i, "embedding": [self.rng.uniform(-1, 1) for _ in range(8)]}
                for i in range(len(inputs))]
        payload = {"object": "list", "data": data, "model": str(body.get("model")),
                   "usage": {"prompt_tokens": 3, "total_tokens": 3}}
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [
            {"id": "fault-model", "object": "model", "created": 0, "owned_by": "detgate-tests"}]})


def _parse_weights(spec: str) -> dict[str, float]:
    pairs = (item.split("=", 1) for item in spec.split(",") if item)
    return {name: float(weight) for name, weight in pairs}


async def _serve(args: argparse.Namespace) -> None:
    plan = FaultPlan(weights=_parse_weights(args.weights), retry_after=args.retry_after,
                     retry_after_format=args.retry_after_format, slow_first_byte_s=args.slow_first_byte,
                     stall_s=args.stall, chunk_delay_s=args.chunk_delay)
    upstream = await FaultUpstream(plan, args.seed).start(args.port)
    print(f"fault upstream listening on {upstream.url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await upstream.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--weights", default="ok=1", help="fault=weight,... from: " + ",".join(FAULTS))
    p.add_argument("--retry-after", type=float, default=1.0)
    p.add_argument("--retry-after-format", choices=("seconds", "date"), default="seconds")
    p.add_argument("--slow-first-byte", type=float, default=0.5)
    p.add_argument("--stall", type=float, default=30.0)
    p.add_argument("--chunk-delay", type=float, default=0.002)
    try:
        asyncio.run(_serve(p.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
