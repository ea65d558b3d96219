"""A fake provider for coding agents: Anthropic Messages and OpenAI Responses, with a tool loop.

Claude Code and Codex only do their real work (write files, run commands) when the model asks
them to, so this fake follows a script: while the conversation holds fewer tool results than
the script has steps, the answer is a call of the script's next tool (a tool the agent itself
offers: Claude Code's `Write`/`Bash`, Codex's shell function); after that, final text. Like a
real provider it never answers twice alike: new ids, new words, new stream cuts on every call.
Calls that are not the agent's main loop (titles, summaries, quota probes) get random text.

Every request is recorded raw (method, path, query, headers, body bytes) so tests and the
capture script can see exactly what an agent sent. `pace_s` spreads a streamed answer over
that many seconds, as a slow model does.

Run alone (to capture what an agent sends): python tests/fakes/agent_upstream.py --port 9100 --log out.jsonl
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

import orjson
from aiohttp import web

if __package__ in (None, ""):  # run as a script: make `fakes` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes.openai_upstream import WORDS  # noqa: E402


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict | None:
        try:
            return orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            return None

    def row(self) -> dict:
        return {"method": self.method, "path": self.path, "query": self.query, "headers": self.headers,
                "body": self.body.decode("utf-8", "replace")}


@dataclass
class FakeAgentUpstream:
    # The tool loop: (tool name, its input) per step. A step is taken when the request offers
    # that tool and the conversation holds fewer tool results than the step's index + 1.
    anthropic_script: list[tuple[str, dict]] = field(default_factory=list)
    responses_script: list[tuple[str, dict | str]] = field(default_factory=list)
    pace_s: float = 0.0  # spread a streamed answer over this long
    seed: int | None = None
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    async def _record(self, request: web.Request) -> Recorded:
        seen = Recorded(request.method, request.path, request.query_string,
                        {k.lower(): v for k, v in request.headers.items()}, await request.read())
        self.requests.append(seen)
        return seen

    def posts(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path == path]

    # ---- shared

    def _text(self) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(4, 30)))

    def _pieces(self, text: str) -> list[str]:
        pieces, at = [], 0
        while at < len(text):
            step = self.rng.randint(1, 12)
            pieces.append(text[at:at + step])
            at += step
        return pieces

    async def _sse(self, request: web.Request, events: list[tuple[str, dict]]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        pause = self.pace_s / max(len(events) - 1, 1)  # a slow model: its events spread evenly over pace_s
        for n, (name, data) in enumerate(events):
            if n and pause:
                await asyncio.sleep(pause)
            wire = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            at = 0
            while at < len(wire):  # an event may be split across writes, as on a real connection
                step = self.rng.randint(1, 300)
                await response.write(wire[at:at + step])
                at += step
        try:
            await response.write_eof()
        except ConnectionResetError:  # Codex hangs up as soon as it has read response.completed
            pass
        return response

    async def _unknown(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"error": {"type": "not_found_error", "message": f"no route {request.path}"}},
                                 status=404)

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"object": "list", "data": [], "has_more": False})

    # ---- Anthropic Messages

    async def _count_tokens(self, request: web.Request) -> web.Response:
        seen = await self._record(request)
        return web.json_response({"input_tokens": 10 + len(seen.body) // 4})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = (await self._record(request)).json()
        if not isinstance(body, dict) or "model" not in body:
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                                 "message": "model: Field required"}}, status=400)
        message = self._message(body)
        if not body.get("stream"):
            return web.json_response(message)
        return await self._sse(request, self._message_events(message))

    def _message(self, body: dict) -> dict:
        step = _anthropic_step(body, self.anthropic_script)
        if step is not None:
            name, arguments = step
            content = [{"type": "text", "text": self._text()},
                       {"type": "tool_use", "id": f"toolu_{secrets.token_hex(12)}", "name": name, "input": arguments}]
            reason = "tool_use"
        else:
            content, reason = [{"type": "text", "text": self._text()}], "end_turn"
        return {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
                "model": body["model"], "content": content, "stop_reason": reason, "stop_sequence": None,
                "usage": {"input_tokens": self.rng.randint(100, 9000), "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0, "output_tokens": self.rng.randint(5, 200)}}

    def _message_events(self, message: dict) -> list[tuple[str, dict]]:
        start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 1}}
        events: list[tuple[str, dict]] = [("message_start", {"type": "message_start", "message": start})]
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                opened = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": p} for p in self._pieces(block["text"])]
            else:
                opened = {**block, "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": p}
                          for p in self._pieces(orjson.dumps(block["input"]).decode())]
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": opened}))
            for delta in deltas:
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
                if self.rng.random() < 0.05:
                    events.append(("ping", {"type": "ping"}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                         "usage": {"output_tokens": message["usage"]["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    # ---- OpenAI Responses

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = (await self._record(request)).json()
        if not isinstance(body, dict) or "model" not in body:
            return web.json_response({"error": {"message": "model is required", "type": "invalid_request_error",
                                                "param": "model", "code": None}}, status=400)
        response = self._response(body)
        if not body.get("stream"):
            return web.json_response(response)
        return await self._sse(request, self._response_events(response))

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{secrets.token_hex(24)}"

    def _response(self, body: dict) -> dict:
        step = _responses_step(body, self.responses_script)
        if step is not None and isinstance(step[1], str):  # a freeform (custom) tool takes raw text
            output = [{"id": self._id("ctc"), "type": "custom_tool_call", "status": "completed",
                       "call_id": self._id("call"), "name": step[0], "input": step[1]}]
        elif step is not None:
            name, arguments = step
            output = [{"id": self._id("fc"), "type": "function_call", "status": "completed",
                       "arguments": orjson.dumps(arguments).decode(), "call_id": self._id("call"), "name": name}]
        else:
            output = [{"id": self._id("msg"), "type": "message", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": self._text()}]}]
        used = self.rng.randint(5, 200)
        return {"id": self._id("resp"), "object": "response", "created_at": int(time.time()), "status": "completed",
                "error": None, "incomplete_details": None, "model": body["model"], "output": output,
                "parallel_tool_calls": False, "tool_choice": body.get("tool_choice", "auto"), "tools": [],
                "usage": {"input_tokens": self.rng.randint(100, 9000), "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": used, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": used + 100}}

    def _response_events(self, response: dict) -> list[tuple[str, dict]]:
        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [{"type": "response.created", "response": opening},
                  {"type": "response.in_progress", "response": opening}]
        for index, item in enumerate(response["output"]):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                where = {"item_id": item["id"], "output_index": index, "content_index": 0}
                events.append({"type": "response.output_item.added", "output_index": index,
                               "item": {**item, "status": "in_progress", "content": []}})
                events.append({"type": "response.content_part.added", **where,
                               "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}})
                events += [{"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
                           for piece in self._pieces(text)]
                events.append({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
                events.append({"type": "response.content_part.done", **where, "part": item["content"][0]})
            elif item["type"] == "custom_tool_call":
                events.append({"type": "response.output_item.added", "output_index": index,
                               "item": {**item, "status": "in_progress", "input": ""}})
                events += [{"type": "response.custom_tool_call_input.delta", "item_id": item["id"],
                            "output_index": index, "delta": piece} for piece in self._pieces(item["input"])]
                events.append({"type": "response.custom_tool_call_input.done", "item_id": item["id"],
                               "output_index": index, "input": item["input"]})
            else:
                events.append({"type": "response.output_item.added", "output_index": index,
                               "item": {**item, "status": "in_progress", "arguments": ""}})
                events += [{"type": "response.function_call_arguments.delta", "item_id": item["id"],
                            "output_index": index, "delta": piece} for piece in self._pieces(item["arguments"])]
                events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                               "output_index": index, "arguments": item["arguments"]})
            events.append({"type": "response.output_item.done", "output_index": index, "item": item})
        events.append({"type": "response.completed", "response": response})
        return [(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]


def _anthropic_step(body: dict, script: list[tuple[str, dict]]) -> tuple[str, dict] | None:
    offered = {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)}
    done = sum(1 for m in body.get("messages") or () if isinstance(m, dict) and isinstance(m.get("content"), list)
               for block in m["content"] if isinstance(block, dict) and block.get("type") == "tool_result")
    if done < len(script) and script[done][0] in offered:
        return script[done]
    return None


def _tool_names(tools: object) -> set[str]:
    """Names of tools, namespaces opened (Codex nests its tools in namespaces)."""
    names: set[str] = set()
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict):
            names.add(tool.get("name"))
            names |= _tool_names(tool.get("tools"))
    return names


def _responses_step(body: dict, script: list[tuple[str, dict | str]]) -> tuple[str, dict | str] | None:
    items = body.get("input") if isinstance(body.get("input"), list) else []
    # Codex offers its tools in an `additional_tools` input item rather than in `tools`.
    offered = _tool_names(body.get("tools")) | _tool_names(
        [t for item in items if isinstance(item, dict) and item.get("type") == "additional_tools"
         for t in item.get("tools") or ()])
    done = sum(1 for item in items if isinstance(item, dict)
               and item.get("type") in ("function_call_output", "custom_tool_call_output"))
    if done < len(script) and script[done][0] in offered:
        return script[done]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--log", type=Path, required=True, help="JSON lines, one recorded request each")
    args = parser.parse_args()
    fake = FakeAgentUpstream()

    async def flush(_app: web.Application) -> None:
        args.log.write_bytes(b"".join(orjson.dumps(r.row()) + b"\n" for r in fake.requests))

    app = fake.app()
    app.on_shutdown.append(flush)

    async def each(request: web.Request, handler):  # write after every call: the capture survives a kill
        try:
            return await handler(request)
        finally:
            await flush(app)

    app.middlewares.append(web.middleware(each))
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
