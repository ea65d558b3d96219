"""Calls to a gateway and checks on its answers, shared by the gateway tests: plain HTTP for
tests that look at raw bytes and headers, the official openai client for the rest, /metrics
samples, the OpenAI error shape, and the `detgate serve` flags for an upstream and Redis."""
from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import orjson
from prometheus_client.parser import text_string_to_metric_families

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


def client(base: str) -> openai.OpenAI:
    """The official client for the gateway at `base`, without its own retries."""
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def serve_args(upstream_url: str, redis_url: str, *extra: str) -> list[str]:
    return ["--upstream", f"fake={upstream_url}", "--redis-url", redis_url, "--secret", SECRET, *extra]


def post(base: str, path: str, body, headers: dict[str, str] | None = None) -> Reply:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    request = urllib.request.Request(base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    return _send(request)


async def post_all(urls: list[str], body: dict) -> list[tuple[str, bytes]]:
    """The same chat request to every URL at once: each answer's x-detgate-cache and body."""
    async with aiohttp.ClientSession() as session:
        async def one(url):
            async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body)) as r:
                assert r.status == 200, await r.text()
                return r.headers["x-detgate-cache"], await r.read()
        return await asyncio.gather(*(one(u) for u in urls))


def get(base: str, path: str, headers: dict[str, str] | None = None) -> Reply:
    return _send(urllib.request.Request(base + path, headers=headers or {}))


def _send(request: urllib.request.Request) -> Reply:
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def assert_openai_error(reply, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert reply.status == status, reply.body
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def samples(url: str) -> dict[tuple[str, tuple], float]:
    reply = get(url, "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics, name: str, **labels) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def sse_payloads(raw: bytes) -> list[bytes]:
    """The data of each event; comments (lines starting with ':') are skipped, as SSE readers do."""
    return [event[len(b"data: "):] for event in raw.split(b"\n\n") if event and not event.startswith(b":")]
