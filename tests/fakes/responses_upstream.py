"""The fake provider's OpenAI Responses API (`/v1/responses`), as nondeterministic as the
rest of fakes/openai_upstream.FakeUpstream, whose calls, behaviours and faults it shares.

Every call gets new ids, a new created_at and new text; every stream new delta chunking
and `obfuscation` padding, written in random TCP pieces. Like OpenAI it keeps what it
answered with `store` (the default), so `previous_response_id` must name a response it
made (else a 404), and `GET` / `DELETE /v1/responses/{id}` and `GET .../input_items` work
on it; conversations (`POST /v1/conversations`) gather the turns of the responses that
name them, and an `item_reference` must name an item it made or was sent. The response
echoes `metadata`, `user`, `safety_identifier`, `prompt_cache_key`, `store` and
`service_tier` as sent. It answers:
- a JSON instance of `text.format`'s schema when one is asked for;
- a function call (arguments made from the tool's schema) when function tools are
  offered, unless `tool_choice` is "none" or the input ends with a call's output;
- a reasoning item first when `reasoning` is asked for, its `encrypted_content` opaque
  random bytes when `include` asks for them;
- `status: incomplete` (reason max_output_tokens) when the text is longer than
  `max_output_tokens` words; `status: queued` for `background: true`.
`metadata.fake` makes a call fail the way OpenAI's do: "failed" (a `response.failed`
stream, or a 200 body with status failed) or "error" (an `error` event mid-stream, or a 500).
"""
from __future__ import annotations

import asyncio
import secrets
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from fakes.faults import FAULT
from fakes.loopback import write_scattered

# Faults the Responses wire tells in its own words: `metadata.fake`'s ways of failing.
_WIRE_FAULTS = {"failed": "failed", "error_event": "error"}


def dumps(obj) -> str:
    return orjson.dumps(obj).decode()

if TYPE_CHECKING:
    from fakes.openai_upstream import FakeUpstream


def mount(app: web.Application, fake: FakeUpstream) -> None:
    responses = fake.responses = FakeResponses(fake)  # its stored state, for tests to look at
    app.router.add_post("/v1/responses", responses.create)
    app.router.add_get("/v1/responses/{id}", responses.retrieve)
    app.router.add_delete("/v1/responses/{id}", responses.delete)
    app.router.add_get("/v1/responses/{id}/input_items", responses.input_items)
    app.router.add_post("/v1/conversations", responses.new_conversation)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _error(status: int, message: str, param: str | None, code: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                        "code": code}}, status=status)


class FakeResponses:
    def __init__(self, fake: FakeUpstream) -> None:
        self.fake = fake
        self.stored: dict[str, dict] = {}
        self.inputs: dict[str, list[dict]] = {}  # a stored response's id -> its input items
        self.items: dict[str, dict] = {}  # every item made or sent, by id
        self.conversations: dict[str, list[dict]] = {}  # id -> its items, oldest first

    async def create(self, request: web.Request) -> web.StreamResponse:
        body, failure = await self.fake._begin(request)
        if failure:
            return failure
        parent = body.get("previous_response_id")
        if parent is not None and parent not in self.stored:
            return _error(404, f"Previous response with id '{parent}' not found.", "previous_response_id",
                          "previous_response_not_found")
        conversation = body.get("conversation")
        conversation = _dict(conversation).get("id") if isinstance(conversation, dict) else conversation
        if conversation is not None and conversation not in self.conversations:
            return _error(404, f"Conversation with id '{conversation}' not found.", "conversation", None)
        given = body.get("input")
        items = [{"id": self._id("msg"), "type": "message", "role": "user", "content": given}] \
            if isinstance(given, str) else [_dict(item) for item in given or ()]
        for item in items:
            if item.get("type") == "item_reference" and item.get("id") not in self.items:
                return _error(404, f"Item with id '{item.get('id')}' not found.", "input", None)
        how = _dict(body.get("metadata")).get("fake") or _WIRE_FAULTS.get(request.get(FAULT) or "")
        if how == "error" and not body.get("stream"):
            return web.json_response({"error": {"message": "The server had an error processing your request.",
                                                "type": "server_error", "param": None, "code": "server_error"}},
                                     status=500)
        response = self._response(body, how)
        if conversation is not None:
            response["conversation"] = {"id": conversation}
            self.conversations[conversation] += [*items, *response["output"]]
        if body.get("store", True):
            self.stored[response["id"]] = response
            self.inputs[response["id"]] = items
            self.items.update((item["id"], item) for item in [*items, *response["output"]] if "id" in item)
        if not body.get("stream"):
            return await self.fake._whole(request, response)
        return await self._stream(request, self._events(response, how), request.get(FAULT))

    async def retrieve(self, request: web.Request) -> web.Response:
        found = self.stored.get(request.match_info["id"])
        if found is None:
            return _error(404, "Response not found.", None, "not_found")
        return web.json_response(found, dumps=lambda o: orjson.dumps(o).decode())

    async def input_items(self, request: web.Request) -> web.Response:
        found = self.inputs.get(request.match_info["id"])
        if found is None:
            return _error(404, "Response not found.", None, "not_found")
        return web.json_response({"object": "list", "data": found, "has_more": False}, dumps=dumps)

    async def new_conversation(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read() or b"{}")
        made = {"id": self._id("conv"), "object": "conversation", "created_at": int(time.time()),
                "metadata": _dict(body.get("metadata"))}
        self.conversations[made["id"]] = [_dict(item) for item in body.get("items") or ()]
        return web.json_response(made, dumps=dumps)

    async def delete(self, request: web.Request) -> web.Response:
        if self.stored.pop(request.match_info["id"], None) is None:
            return _error(404, "Response not found.", None, "not_found")
        return web.json_response({"id": request.match_info["id"], "object": "response.deleted", "deleted": True})

    # ---- the answer

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{secrets.token_hex(24)}"

    def _response(self, body: dict, how: str | None) -> dict:
        rng = self.fake.rng
        output: list[dict] = []
        if isinstance(body.get("reasoning"), dict):
            reasoning = {"id": self._id("rs"), "type": "reasoning", "summary": []}
            if "reasoning.encrypted_content" in (body.get("include") or ()):
                reasoning["encrypted_content"] = secrets.token_urlsafe(rng.randint(40, 120))
            output.append(reasoning)
        status, incomplete = "completed", None
        tool = self._tool(body)
        if tool is not None:
            output.append({"id": self._id("fc"), "type": "function_call", "status": "completed",
                           "arguments": orjson.dumps(self._instance(tool.get("parameters"))).decode(),
                           "call_id": self._id("call"), "name": tool["name"]})
            text = ""
        else:
            form = _dict(_dict(body.get("text")).get("format"))
            text = (orjson.dumps(self._instance(form.get("schema"))).decode()
                    if form.get("type") == "json_schema" and self.fake.behaviour.answer is None else self.fake._text())
            limit = body.get("max_output_tokens")
            if type(limit) is int and len(text.split()) > limit:
                text = " ".join(text.split()[:limit])
                status, incomplete = "incomplete", {"reason": "max_output_tokens"}
            output.append({"id": self._id("msg"), "type": "message", "status": status, "role": "assistant",
                           "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]})
        error = None
        if how == "failed":
            status, error = "failed", {"code": "server_error", "message": "The model failed to generate a response."}
        if body.get("background"):
            status, output = "queued", []
        words = len(text.split())
        return {
            "id": self._id("resp"), "object": "response", "created_at": int(time.time()) + rng.randint(0, 10**6),
            "status": status, "background": bool(body.get("background")), "error": error,
            "incomplete_details": incomplete, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": f"{body['model']}-fake-0001",
            "output": output, "parallel_tool_calls": True, "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": _dict(body.get("reasoning")).get("effort"), "summary": None},
            "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": body.get("top_p", 1.0), "truncation": "disabled",
            "usage": {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": words,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 11 + words},
            "user": body.get("user"), "safety_identifier": body.get("safety_identifier"),
            "prompt_cache_key": body.get("prompt_cache_key"), "service_tier": body.get("service_tier") or "default",
            "metadata": body.get("metadata") or {},
        }

    def _tool(self, body: dict) -> dict | None:
        tools = [t for t in body.get("tools") or () if t.get("type") == "function"]
        items = body.get("input")
        answered = isinstance(items, list) and items and _dict(items[-1]).get("type") == "function_call_output"
        if not tools or body.get("tool_choice") == "none" or answered:
            return None
        return tools[0]

    def _instance(self, schema: Any) -> Any:
        """A value of `schema` with random content (enough of JSON Schema for tests)."""
        rng = self.fake.rng
        if not isinstance(schema, dict):
            return self.fake._text()
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return rng.choice(schema["enum"])
        for union in ("anyOf", "oneOf"):
            if isinstance(schema.get(union), list) and schema[union]:
                return self._instance(schema[union][0])
        kind = schema.get("type", "object" if "properties" in schema else "string")
        if kind == "object":
            return {name: self._instance(sub) for name, sub in _dict(schema.get("properties")).items()}
        if kind == "array":
            return [self._instance(schema.get("items")) for _ in range(rng.randint(1, 3))]
        if kind == "integer":
            return rng.randint(0, 1000)
        if kind == "number":
            return round(rng.uniform(0, 1000), 3)
        if kind == "boolean":
            return rng.random() < 0.5
        return self.fake._text()

    # ---- the stream

    def _events(self, response: dict, how: str | None) -> list[dict]:
        opening = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None,
                   "error": None}
        if response["status"] == "queued":
            opening["status"] = "queued"
        events: list[dict] = [{"type": "response.created", "response": opening},
                              {"type": "response.in_progress", "response": opening}]
        for index, item in enumerate(response["output"]):
            events += self._item_events(index, item)
        if how == "error":
            cut = self.fake.rng.randint(2, len(events))
            return [*events[:cut], {"type": "error", "code": "server_error", "param": None,
                                    "message": "The server had an error while processing your request."}]
        terminal = {"completed": "response.completed", "incomplete": "response.incomplete",
                    "failed": "response.failed"}.get(response["status"], "response.completed")
        return [*events, {"type": terminal, "response": response}]

    def _item_events(self, index: int, item: dict) -> list[dict]:
        out: list[dict] = []
        item_id = item["id"]
        if item["type"] == "message":
            out.append({"type": "response.output_item.added", "output_index": index,
                        "item": {**item, "status": "in_progress", "content": []}})
            part = item["content"][0]
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            out.append({"type": "response.content_part.added", **where,
                        "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}})
            for piece in self.fake._pieces(part["text"]):
                out.append({"type": "response.output_text.delta", **where, "delta": piece, "logprobs": [],
                            "obfuscation": secrets.token_urlsafe(self.fake.rng.randint(1, 12))})
            out.append({"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []})
            out.append({"type": "response.content_part.done", **where, "part": part})
        elif item["type"] == "function_call":
            out.append({"type": "response.output_item.added", "output_index": index,
                        "item": {**item, "status": "in_progress", "arguments": ""}})
            for piece in self.fake._pieces(item["arguments"]):
                out.append({"type": "response.function_call_arguments.delta", "item_id": item_id,
                            "output_index": index, "delta": piece,
                            "obfuscation": secrets.token_urlsafe(self.fake.rng.randint(1, 12))})
            out.append({"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": index,
                        "arguments": item["arguments"]})
        else:
            out.append({"type": "response.output_item.added", "output_index": index, "item": item})
        out.append({"type": "response.output_item.done", "output_index": index, "item": item})
        return out

    async def _stream(self, request: web.Request, events: list[dict], fault: str | None = None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        behaviour, rng = self.fake.behaviour, self.fake.rng
        cut, stall_s = behaviour.break_stream_after, None
        if fault in ("stall", "broken"):  # fakes/faults.py, as the chat stream takes them
            cut = self.fake.faults.cut(len(events))
            stall_s = self.fake.faults.plan.stall_s if fault == "stall" else None
        wire = b"".join(b"event: " + e["type"].encode() + b"\ndata: "
                        + orjson.dumps({"type": e["type"], "sequence_number": n, **e}) + b"\n\n"
                        for n, e in enumerate(events[:cut]))
        await write_scattered(response, wire, rng, behaviour.chunk_delay_s, behaviour.pace_s)
        if cut is not None:
            if stall_s is not None:
                await asyncio.sleep(stall_s)
            if request.transport is not None:
                request.transport.close()  # a dropped connection, not a clean end
            return response
        await response.write_eof()
        self.fake.stream_ends.append(time.monotonic())
        return response
