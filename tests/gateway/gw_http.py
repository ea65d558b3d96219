"""Plain HTTP calls to a gateway, for tests that look at raw bytes and headers."""
from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]
SECRET = "test-secret-0123456789"
CHAT = {"model": "fake/m1", "messages": [{"role": "user", "content": "Say hello."}]}


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return orjson.loads(self.body)

    @property
    def cache(self) -> str | None:
        return self.headers.get("x-detgate-cache")

    @property
    def key(self) -> str | None:
        return self.headers.get("x-detgate-key")


def post(base: str, path: str, body, headers: dict[str, str] | None = None) -> Reply:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    request = urllib.request.Request(base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    return _send(request)


def get(base: str, path: str, headers: dict[str, str] | None = None) -> Reply:
    return _send(urllib.request.Request(base + path, headers=headers or {}))


def _send(request: urllib.request.Request) -> Reply:
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def sse_payloads(raw: bytes) -> list[bytes]:
    return [event[len(b"data: "):] for event in raw.split(b"\n\n") if event]
