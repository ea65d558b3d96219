"""A streamed request with tools goes out live through the gateway (issue 40), on all three
streaming wires, through the official SDKs over real HTTP.

The fake upstreams pace a tool-call answer over seconds, with the gateway's idle timeout
shorter than the whole answer but longer than any pause in it: the client must see its
first bytes and events before the upstream has finished, the stream must not be cut or
counted as a failure, the answer must be stored once complete (the next request a hit
with the same bytes), and an answer whose tool call breaks its schema is passed on as it
came but never stored. Times are compared by order (before / after the upstream's end),
never against tight bounds.
"""
from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import anthropic
import openai
import orjson
import pytest

try:  # the HTTP library the SDKs are built on: httpx, or its successor in the newer releases
    import httpx2 as httpx
except ImportError:
    import httpx

from claude_http import MODEL as CLAUDE, WEATHER as CLAUDE_WEATHER, upstreams
from gw_http import CHAT, SECRET, get, post, sse_payloads
from noisy_gw import metric

WIRES = ("chat", "responses", "messages")
QUESTION = "Find the weather in Paris. Use the tool."
PARAMETERS = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
              "required": ["query"]}  # what the OpenAI fake's calls carry
CHAT_TOOLS = [{"type": "function", "function": {"name": "search", "parameters": PARAMETERS}}]
RESPONSES_TOOLS = [{"type": "function", "name": "search", "parameters": PARAMETERS}]


class _Noted(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, pieces: list[tuple[float, bytes]]) -> None:
        self.inner, self.pieces = inner, pieces

    def __iter__(self):
        for piece in self.inner:
            self.pieces.append((time.monotonic(), piece))
            yield piece

    def close(self) -> None:
        self.inner.close()


class Tee(httpx.BaseTransport):
    """The SDK's transport, noting when each piece of each response body arrived."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.bodies: list[list[tuple[float, bytes]]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        pieces: list[tuple[float, bytes]] = []
        self.bodies.append(pieces)
        return httpx.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                              stream=_Noted(response.stream, pieces))

    def close(self) -> None:
        self.inner.close()


@dataclass
class Streamed:
    cache: str
    first_byte: float
    first_event: float
    last_byte: float
    raw: bytes
    events: list = field(default_factory=list)


def stream(wire: str, base: str) -> Streamed:
    """One stream=True request with a tool through the official SDK of `wire`."""
    tee = Tee()
    http = httpx.Client(transport=tee, timeout=120)
    if wire == "messages":
        api = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, http_client=http)
        raw = api.messages.with_raw_response.create(model=CLAUDE, max_tokens=256, tools=[CLAUDE_WEATHER],
                                                    tool_choice={"type": "any"}, stream=True,
                                                    messages=[{"role": "user", "content": QUESTION}])
    else:
        api = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, http_client=http)
        if wire == "chat":
            raw = api.chat.completions.with_raw_response.create(
                model="fake/m1", messages=[{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS,
                tool_choice="required", stream=True)
        else:
            raw = api.responses.with_raw_response.create(model="fake/m1", input=QUESTION, tools=RESPONSES_TOOLS,
                                                         stream=True)
    events, first_event = [], None
    for event in raw.parse():
        first_event = first_event or time.monotonic()
        events.append(event)
    http.close()
    (pieces,) = tee.bodies
    return Streamed(raw.headers["x-detgate-cache"], pieces[0][0], first_event, pieces[-1][0],
                    b"".join(p for _, p in pieces), events)


def called_a_tool(wire: str, events: list) -> bool:
    kinds = {getattr(e, "type", None) for e in events}
    if wire == "chat":
        return any(c.choices and c.choices[0].delta.tool_calls for c in events)
    if wire == "responses":
        return "response.function_call_arguments.done" in kinds
    return any(e.type == "content_block_start" and e.content_block.type == "tool_use" for e in events)


@pytest.fixture
def paced(upstream, claude, gateway):
    """(gateway, fakes by wire) with both fakes pacing their streams over `pace_s`, the
    gateway's idle timeout `idle_s` and its upstream deadline `total_s`."""
    def start(pace_s: float, idle_s: float, total_s: float = 600):
        openai_fake, anthropic_fake = upstream[0], claude[0]
        openai_fake.behaviour.pace_s = anthropic_fake.behaviour.pace_s = pace_s
        gw = gateway(upstreams=upstreams(upstream, claude), upstream_idle_timeout_s=idle_s, upstream_timeout_s=total_s)
        return gw, {"chat": openai_fake, "responses": openai_fake, "messages": anthropic_fake}

    return start


def samples(gw, name: str) -> list[tuple[str, float]]:
    """(labels, value) of each sample of metric `name` on the gateway's /metrics."""
    lines = get(gw.url, "/metrics").body.decode().splitlines()
    return [(line[len(name):].rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1])) for line in lines
            if line.startswith(name + "{")]


def assert_healthy(gw, calls: int) -> None:
    """`calls` upstream calls, every one a 200; none retried; no circuit opened."""
    requests = samples(gw, "detgate_upstream_requests_total")
    assert sum(v for _, v in requests) == calls and all('code="200"' in labels for labels, _ in requests)
    assert not samples(gw, "detgate_upstream_retries_total")
    assert all(v == 0 for _, v in samples(gw, "detgate_circuit_open"))


def test_answers_paced_over_30s_stream_live_through_a_5s_idle_timeout(paced):
    gw, fakes = paced(pace_s=30, idle_s=5, total_s=10)
    with ThreadPoolExecutor(len(WIRES)) as pool:  # all three wires at once: one 30 s wait
        live = dict(zip(WIRES, pool.map(lambda wire: stream(wire, gw.url), WIRES)))
    upstream_done = min(end for fake in fakes.values() for end in fake.stream_ends)
    for wire, got in live.items():
        assert got.cache == "miss" and called_a_tool(wire, got.events), wire
        # Bytes and events reached the SDK while the upstream was still writing its answer...
        assert got.first_byte <= got.first_event < upstream_done, wire
        # ...and the stream outlived the idle timeout and the upstream deadline (which bounds
        # only its start) without being cut.
        assert got.last_byte - got.first_byte > 10, wire
    assert_healthy(gw, calls=3)
    for wire in WIRES:  # stored once complete: a hit, the same bytes, no upstream call
        again = stream(wire, gw.url)
        assert again.cache == "hit" and again.raw == live[wire].raw, wire
    assert len(fakes["chat"].stream_ends) == 2 and len(fakes["messages"].stream_ends) == 1


@pytest.mark.parametrize("wire", WIRES)
def test_a_paced_tool_call_streams_live_and_is_stored_once_complete(paced, wire):
    gw, fakes = paced(pace_s=3, idle_s=1)
    miss = stream(wire, gw.url)
    assert miss.cache == "miss" and called_a_tool(wire, miss.events)
    assert miss.first_byte <= miss.first_event < fakes[wire].stream_ends[0]
    hit = stream(wire, gw.url)
    assert hit.cache == "hit" and hit.raw == miss.raw and len(fakes[wire].stream_ends) == 1
    assert_healthy(gw, calls=1)


def test_a_streamed_tool_use_that_breaks_its_schema_is_passed_on_live_but_not_stored(paced):
    gw, fakes = paced(pace_s=3, idle_s=1)
    fakes["messages"].behaviour.invalid_input_times = 1
    bad = stream("messages", gw.url)
    assert bad.cache == "miss" and bad.first_event < fakes["messages"].stream_ends[0]
    used = next(e for e in bad.events if e.type == "content_block_start" and e.content_block.type == "tool_use")
    assert used.content_block.name == CLAUDE_WEATHER["name"]
    # Headers had left: the stream says it in an SSE comment (skipped by the SDK), the metrics count it.
    assert b": x-detgate-warnings: answer not stored: the answer does not match its schema" in bad.raw
    assert metric(gw, 'detgate_schema_attempts_total{model="%s",result="streamed_invalid"}' % CLAUDE) == 1
    again = stream("messages", gw.url)  # asked again, not replayed
    assert again.cache == "miss" and len(fakes["messages"].stream_ends) == 2
    assert b"x-detgate-warnings" not in again.raw
    assert stream("messages", gw.url).cache == "hit"


def test_the_access_log_says_when_a_streamed_answer_was_not_stored(upstream, gateway_process):
    fake, url = upstream
    gw = gateway_process(["--upstream", f"fake={url}", "--secret", SECRET, "--log-level", "INFO"])
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    body = {"model": "fake/m1", "messages": [{"role": "user", "content": QUESTION}], "stream": True,
            "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "search", "parameters": city}}]}
    first, second = post(gw.url, "/v1/chat/completions", body), post(gw.url, "/v1/chat/completions", body)
    assert (first.headers["x-detgate-cache"], second.headers["x-detgate-cache"]) == ("miss", "miss")
    assert sse_payloads(first.body)[-1] == b"[DONE]" and len(fake.calls) == 2  # whole streams, not stored
    gw.stop()
    access = [orjson.loads(line) for line in gw.process.stderr.read().splitlines() if b'"detgate.access"' in line]
    warned = [line["warnings"] for line in access if line["path"] == "/v1/chat/completions"]
    assert len(warned) == 2 and all("answer not stored: the answer does not match its schema: "
                                    "tool_calls[0].function.arguments: 'city' is a required property" in w
                                    for w in warned), warned


def test_neither_a_slow_stream_nor_a_client_that_leaves_counts_against_the_upstream(upstream, gateway):
    fake, _ = upstream
    fake.behaviour.pace_s = 3
    gw = gateway(upstream_idle_timeout_s=1, breaker_failures=1, breaker_open_s=60)  # one failure would open it
    body = {**CHAT, "stream": True}
    request = urllib.request.Request(gw.url + "/v1/chat/completions", data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        assert reply.readline()  # the first bytes, then the client hangs up
    deadline = time.monotonic() + 20
    while not fake.stream_ends and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # the gateway stores right after the upstream's last byte
    assert post(gw.url, "/v1/chat/completions", body).headers["x-detgate-cache"] == "hit"
    fake.behaviour.pace_s = 0
    assert post(gw.url, "/v1/chat/completions", {**CHAT, "seed": 5}).status == 200  # the circuit stayed closed
    assert_healthy(gw, calls=2)
