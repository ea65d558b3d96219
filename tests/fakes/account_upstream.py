"""A fake OpenAI whose stored objects belong to the account that made them, as real files,
batches and stored responses do, and which records every call it gets.

The cached routes are FakeUpstream's (as nondeterministic as ever). On top: the Files API,
where a file belongs to the account of the call that uploaded it: the API key with the
OpenAI-Organization and OpenAI-Project headers sent beside it. Keys not starting "sk-"
get a 401 that quotes them in full, as some providers do. Every request that arrives,
whatever its path, is recorded with its headers, so a test can tell that a call never
left the gateway, or what it carried when it did.
"""
from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from gateway.upstream.discovery import USER_AGENT

from fakes.openai_upstream import FakeUpstream

ACCOUNT_HEADERS = ("Authorization", "OpenAI-Organization", "OpenAI-Project")


@dataclass(frozen=True)
class Seen:
    method: str
    target: str  # the request target as it came on the wire
    headers: dict[str, str]  # lower-cased names


@dataclass
class AccountUpstream:
    chat: FakeUpstream = field(default_factory=FakeUpstream)
    seen: list[Seen] = field(default_factory=list)  # what the gateway sent on clients' behalf
    probes: list[Seen] = field(default_factory=list)  # the gateway's own discovery requests
    files: dict[str, tuple[tuple[str | None, ...], dict, bytes]] = field(default_factory=dict)  # id -> (account, file, data)
    answer_headers: dict[str, str] = field(default_factory=dict)  # the last answer's own headers

    def app(self) -> web.Application:
        app = self.chat.app()
        app.middlewares.append(self._record)
        app.on_response_prepare.append(self._stamp)
        app.router.add_post("/v1/files", self._create)
        app.router.add_get("/v1/files", self._list)
        app.router.add_get("/v1/files/{id}", self._retrieve)
        app.router.add_delete("/v1/files/{id}", self._delete)
        app.router.add_get("/v1/files/{id}/content", self._content)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler) -> web.StreamResponse:
        seen = Seen(request.method, request.raw_path, {k.lower(): v for k, v in request.headers.items()})
        (self.probes if seen.headers.get("user-agent") == USER_AGENT else self.seen).append(seen)
        return await handler(request)

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        """What OpenAI sends with every answer: about the account, its limits, the call."""
        self.answer_headers = {"openai-organization": "org-operator", "x-ratelimit-remaining-requests": "4999",
                               "set-cookie": f"__cf_bm={secrets.token_hex(8)}; path=/; HttpOnly",
                               "x-request-id": f"req_{secrets.token_hex(12)}", "openai-processing-ms": "12"}
        response.headers.update(self.answer_headers)

    def _account(self, request: web.Request) -> tuple[str | None, ...]:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not key.startswith("sk-"):
            raise web.HTTPUnauthorized(content_type="application/json", text=(
                '{"error": {"message": "Incorrect API key provided: %s. You can find your API key at '
                'https://platform.example/account/api-keys.", "type": "invalid_request_error", "param": null, '
                '"code": "invalid_api_key"}}' % key))
        return (key, *(request.headers.get(h) for h in ACCOUNT_HEADERS[1:]))

    def _own(self, request: web.Request) -> tuple[dict, bytes]:
        found = self.files.get(request.match_info["id"])
        if found is None or found[0] != self._account(request):
            raise web.HTTPNotFound(content_type="application/json", text=(
                '{"error": {"message": "No such File object.", "type": "invalid_request_error", '
                '"param": "id", "code": null}}'))
        return found[1], found[2]

    async def _create(self, request: web.Request) -> web.Response:
        account = self._account(request)
        form = await request.post()
        upload = form["file"]
        data = upload.file.read()
        file = {"id": f"file-{secrets.token_hex(12)}", "object": "file", "bytes": len(data),
                "created_at": int(time.time()) + random.randint(0, 10**6), "filename": upload.filename,
                "purpose": form["purpose"], "status": "processed"}
        self.files[file["id"]] = (account, file, data)
        return web.json_response(file)

    async def _list(self, request: web.Request) -> web.Response:
        account = self._account(request)
        data = [file for owner, file, _ in self.files.values() if owner == account]
        return web.json_response({"object": "list", "data": data, "has_more": False})

    async def _retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self._own(request)[0])

    async def _delete(self, request: web.Request) -> web.Response:
        file, _ = self._own(request)
        del self.files[file["id"]]
        return web.json_response({"id": file["id"], "object": "file", "deleted": True})

    async def _content(self, request: web.Request) -> web.Response:
        return web.Response(body=self._own(request)[1], content_type="application/octet-stream")
