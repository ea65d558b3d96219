"""The SDK matrix's harness: a gateway that notes every request it answers (the client's
body and headers, and its x-detgate-cache), and `twice`, which makes one client call twice and
checks the first is a miss, the second a hit that tells the app the same, and says which
request field differed when it was not."""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from fakes.loopback import LoopbackServer
from gateway.app import create_app
from gateway.config import Settings

REPO = Path(__file__).resolve().parents[2]
SECRET = "sdk-matrix-secret-0123456789"
OPENAI_MODEL = "gpt-4.1"  # a name the clients know (litellm fakes a Responses stream for names it does not)
CLAUDE_MODEL = "claude-sonnet-4-6"  # takes temperature or top_p, never both (the fake checks, as the API does)
# The fake chat provider calls a tool with {"query": <text>, "limit": <int>}; the others fill any schema.
SEARCH_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                 "required": ["query", "limit"], "additionalProperties": False}
SEARCH_DESCRIPTION = "Search the documentation."

NODE_PREFIX = REPO / "build" / "clients"
NODE_SCRIPTS = Path(__file__).resolve().parent / "node"
# Pinned together: the versions the matrix was last run with (docs/clients.md).
NODE_PACKAGES = ("openai@7.55.0", "ai@7.0.173", "@ai-sdk/openai@4.0.118", "@ai-sdk/anthropic@4.0.105")


@dataclass
class Seen:
    """One request the gateway answered, as the client sent it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    cache: str | None = None
    status: int | None = None  # None while the answer is still being written


@dataclass
class Run:
    result: Any
    requests: list[Seen]
    outcomes: dict[str, float]  # detgate_requests by cache outcome, this run's increase
    upstream_calls: int
    echo: Any = None  # what the result held under "echo", set apart by `twice`


class Gateway:
    """The gateway in this process (a loop thread) on real Redis, in front of both fakes."""

    def __init__(self, redis_url: str, openai_fake, openai_url: str, claude_fake, claude_url: str) -> None:
        settings = Settings.model_validate({
            "upstreams": [f"fake={openai_url}", {"name": "claude", "url": claude_url, "profile": "anthropic",
                                                 "api_key": "sk-op"}],
            "redis_url": redis_url, "secret": SECRET, "log_level": "WARNING"})
        app = create_app(settings)
        app.middlewares.append(self._note)  # innermost: it sees the request as the handler does
        self.server = LoopbackServer(app)
        self.fakes = (openai_fake, claude_fake)
        self.seen: list[Seen] = []

    def __enter__(self) -> Gateway:
        self.server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)

    @property
    def url(self) -> str:
        return self.server.url

    @web.middleware
    async def _note(self, request: web.Request, handler):
        if request.method != "POST":
            return await handler(request)
        seen = Seen(request.method, request.path, dict(request.headers), await request.read())
        self.seen.append(seen)
        try:
            response = await handler(request)
        except web.HTTPException as error:
            seen.status = error.status
            raise
        seen.cache, seen.status = response.headers.get("x-detgate-cache"), response.status
        return response

    def outcomes(self) -> dict[str, float]:
        with __import__("urllib.request").request.urlopen(self.url + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                # Its own GETs of /metrics count too, as bypasses of the metrics route.
                if sample.name == "detgate_requests_total" and sample.labels["route"] != "metrics":
                    out[sample.labels["cache"]] = out.get(sample.labels["cache"], 0.0) + sample.value
        return out

    def upstream_calls(self) -> int:
        return sum(len(fake.calls) for fake in self.fakes)

    def run(self, call: Callable[[], Any]) -> Run:
        start, before, calls = len(self.seen), self.outcomes(), self.upstream_calls()
        result = call()
        # A stream's client may finish reading before the handler has returned.
        deadline = time.monotonic() + 10
        while True:
            requests = self.seen[start:]
            after = self.outcomes()
            outcomes = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
            if (all(r.status is not None for r in requests) and sum(outcomes.values()) >= len(requests)) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return Run(result, requests, outcomes, self.upstream_calls() - calls)


def twice(gw: Gateway, call: Callable[[], Any], stream: bool, then: Callable[[], Any] | None = None) -> tuple[Run, Run]:
    """The same client call twice: the first misses (every request it makes goes upstream),
    the second hits (none does) and the app sees exactly what it saw the first time. `stream`:
    whether the client asked for a stream (checked: a client could quietly not). `then`: a
    second call that differs only in unkeyed fields; what each run's result holds under "echo"
    (the fields the wire echoes back) is left for the caller to check, the rest must match."""
    first, second = gw.run(call), gw.run(then or call)
    for run in (first, second):
        run.echo = run.result.pop("echo", None) if isinstance(run.result, dict) else None
    assert first.requests, "the client sent the gateway no request"
    sent = [orjson.loads(r.body).get("stream") is True for r in first.requests]
    assert sent == [stream] * len(first.requests), [orjson.loads(r.body) for r in first.requests]
    assert all(r.status == 200 for r in first.requests + second.requests), \
        [(r.path, r.status) for r in first.requests + second.requests]
    assert [r.cache for r in first.requests] == ["miss"] * len(first.requests), [r.cache for r in first.requests]
    assert first.upstream_calls == len(first.requests)
    assert len(second.requests) == len(first.requests), (len(first.requests), len(second.requests))
    assert [r.cache for r in second.requests] == ["hit"] * len(second.requests), why_missed(first, second)
    assert first.outcomes == {"miss": len(first.requests)} and second.outcomes == {"hit": len(second.requests)}, \
        (first.outcomes, second.outcomes)
    assert second.upstream_calls == 0
    assert first.result == second.result, (first.result, second.result)
    assert any(v for v in _leaves(first.result)), f"the app got nothing to compare: {first.result!r}"
    return first, second


def why_missed(first: Run, second: Run) -> str:
    """Which fields of the client's requests differed between the two runs."""
    lines = []
    for index, (a, b) in enumerate(zip(first.requests, second.requests)):
        if b.cache == "hit":
            continue
        lines.append(f"request {index} {b.method} {b.path}: {b.cache}")
        try:
            lines += [f"  body {d}" for d in json_diff(orjson.loads(a.body), orjson.loads(b.body))]
        except orjson.JSONDecodeError:
            lines.append("  body is not JSON" if a.body != b.body else "  same body bytes")
        names = {k.lower() for k in (*a.headers, *b.headers)}
        ha, hb = ({k.lower(): v for k, v in h.items()} for h in (a.headers, b.headers))
        lines += [f"  header {n}: {ha.get(n)!r} -> {hb.get(n)!r}" for n in sorted(names) if ha.get(n) != hb.get(n)]
    return "\n".join(lines)


def json_diff(a: Any, b: Any, path: str = "$") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted({*a, *b}) for d in json_diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {_short(a)} -> {_short(b)}"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _leaves(value: Any):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def node_installed() -> bool:
    """Whether build/clients holds every pinned package at its pinned version."""
    for spec in NODE_PACKAGES:
        name, version = spec.rsplit("@", 1)
        manifest = NODE_PREFIX / "node_modules" / name / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return True


def install_node() -> subprocess.CompletedProcess:
    NODE_PREFIX.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_PREFIX), *NODE_PACKAGES],
                          capture_output=True, text=True, timeout=600)


def node(script: str, ask: dict) -> dict:
    """Run tests/clients/node/<script> with its packages: copied beside build/clients/node_modules,
    where Node resolves them; its one line of JSON."""
    target = NODE_PREFIX / script
    target.write_bytes((NODE_SCRIPTS / script).read_bytes())
    done = subprocess.run(["node", str(target), json.dumps(ask)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def node_twice(gw: Gateway, script: str, ask: dict, stream: bool) -> Run:
    """`twice` over a Node script, whose client must also have seen x-detgate-cache miss, then hit
    (popped: the app's view is the rest of its line). The first run."""
    seen_by_client = []

    def call() -> dict:
        out = node(script, ask)
        seen_by_client.append(out.pop("cache"))
        return out

    first, _ = twice(gw, call, stream)
    assert seen_by_client == ["miss", "hit"]
    return first
