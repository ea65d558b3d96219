"""Load + fault run: many requests through several gateway processes while things break.

Starts a real redis-server (append-only, fsync always, so what was stored survives a
kill -9), the fault-injecting upstream in its own process, and N `detgate serve`
processes sharing that Redis. Then sends a bounded number of requests over loopback —
chat completions, completions, embeddings, OpenAI Responses and Anthropic Messages, all
but embeddings partly streamed, Responses and Messages partly with a tool and partly as a
chained turn (`previous_response_id`, or the conversation so far), drawn from a small hot
set and a large cold set of prompts so there are hits, misses and coalesced calls — while
Redis is killed with SIGKILL and restarted every so many requests, and the upstream
returns 500s, 429s, resets, slow first bytes, stalls (cut by the gateway's idle timeout),
broken streams and bodies, and each wire's own failures: Responses `response.failed`
and `error` events (a 200 body with status failed, a 500), Anthropic 529
`overloaded_error` and mid-stream `error` events.

Every answer is classified:
    ok          200 with a complete answer (a chat or completion stream ends in [DONE], a
                Responses one in response.completed, a Messages one in message_stop)
    error       a well-formed error of its wire: non-2xx with OpenAI's {"error": {...}} or
                Anthropic's {"type": "error", ...}, a stream that ends with its wire's error
                event, a Responses answer that failed (status failed, response.failed)
    lost        anything else: a connection the gateway dropped, a stream cut without an
                error event, a body that is neither an answer nor an error, no answer
                within --client-timeout
Answers given while Redis was down must say `x-detgate-cache: bypass`; the run counts them.
After the load, every key that was answered is read back through the gateway with
`x-detgate-cache-control: only-if-cached`, and an entry is counted corrupt when it is
not a complete answer, or when any earlier hit for its key got different bytes (the
entry changed after someone read it).

A live stream that went out as a miss or coalesced can differ from the entry stored under
its key: its headers left before the answer was stored. That happens only when its flight
failed to store the answer or another replica stored first (its flight ran without the
cross-replica lock, a failed lock call being given up on, not failed). The gateways count
each such stream (detgate_live_stream_unstored_total); the run reports how many streams
differed beside that count, which bounds them.

    python3 bench/load_faults.py --requests 20000 --gateways 2
Writes bench/results/load_faults.json and .md.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from redis_process import RedisProcess, free_port  # noqa: E402  (test tooling, found via the path above)

DEFAULT_FAULTS = "ok=84,500=4,429=3,reset=2,broken=2,stall=2,slow_first_byte=1,failed=1,error_event=1"
ROUTES = {"chat": "/v1/chat/completions", "text": "/v1/completions", "embed": "/v1/embeddings",
          "resp": "/v1/responses", "msg": "/v1/messages"}
HEADERS = {"msg": {"anthropic-version": "2023-06-01"}}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = {"resp": {"tools": [{"type": "function", "name": "lookup", "parameters": SCHEMA}]},
         "msg": {"tools": [{"name": "lookup", "input_schema": SCHEMA}], "tool_choice": {"type": "any"}}}


@dataclass
class Tally:
    sent: int = 0
    outcomes: collections.Counter = field(default_factory=collections.Counter)  # "ok:hit", "error:502:code", "lost:why"
    # key -> bodies that non-stream hits returned; key -> the first non-stream miss/coalesced body
    hit_bodies: dict = field(default_factory=lambda: collections.defaultdict(set))
    first_fill: dict = field(default_factory=dict)
    stream_hits: dict = field(default_factory=lambda: collections.defaultdict(set))
    first_stream: dict = field(default_factory=dict)  # key -> text of the first streamed miss/coalesced
    prompts: dict = field(default_factory=dict)  # key -> (route, body) it was signed from, to read it back
    lost_examples: list = field(default_factory=list)  # (route, cache, last event names, last event) of lost streams
    by_route: collections.Counter = field(default_factory=collections.Counter)  # "resp ok", "msg lost", ...

    def kind(self, prefix: str) -> int:
        return sum(n for k, n in self.outcomes.items() if k.startswith(prefix))


def _error_code(route: str, payload: bytes) -> str | None:
    """The error code of an error body in the shape of the route's wire (Anthropic's
    {"type": "error", "error": {type, message}} on Messages, OpenAI's {"error": {...}}
    elsewhere), or None when it is not one."""
    try:
        parsed = orjson.loads(payload)
        err = parsed["error"]
        if not isinstance(err, dict) or not isinstance(err.get("message"), str):
            return None
        if route == "msg":
            return str(err["type"]) if parsed.get("type") == "error" and isinstance(err.get("type"), str) else None
        return str(err.get("code") or err.get("type") or "none") if "type" not in parsed else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return None


def _sorted_json(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _body_text(route: str, body: dict) -> str | None:
    """What an answer says, the same whether read from its body or its stream."""
    if route == "embed":
        return None
    if route == "resp":
        out = []
        for item in body["output"]:
            if item.get("type") == "message":
                out += [part.get("text", "") for part in item["content"] if part.get("type") == "output_text"]
            elif item.get("type") == "function_call":
                out.append(_sorted_json(orjson.loads(item["arguments"])))
        return "|".join(out)
    if route == "msg":
        return "|".join(block["text"] if block["type"] == "text" else _sorted_json(block.get("input"))
                        for block in body["content"] if block["type"] in ("text", "tool_use"))
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _stream_text(route: str, events: list[tuple[str | None, dict]]) -> str:
    """The answer's text from its stream's events, as _body_text reads a body."""
    if route in ("chat", "text"):
        return "".join((choice.get("delta") or {}).get("content") or choice.get("text") or ""
                       for _, event in events for choice in event["choices"] or [])
    parts: dict[int, list[str]] = collections.defaultdict(list)
    calls: set[int] = set()
    for _, event in events:
        kind = event.get("type")
        if route == "resp" and kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            parts[event["output_index"]].append(event["delta"])
            if kind == "response.function_call_arguments.delta":
                calls.add(event["output_index"])
        elif route == "msg" and kind == "content_block_delta":
            delta = event["delta"]
            if delta["type"] in ("text_delta", "input_json_delta"):
                parts[event["index"]].append(delta.get("text") or delta.get("partial_json") or "")
                if delta["type"] == "input_json_delta":
                    calls.add(event["index"])
    return "|".join(_sorted_json(orjson.loads("".join(parts[i]))) if i in calls else "".join(parts[i])
                    for i in sorted(parts))


def _request(route: str, prompt: str, stream: bool, tools: bool = False, before: dict | None = None) -> dict:
    """A request; `before` (a Responses answer's id, or the Messages conversation so far)
    makes it a turn that continues an earlier one."""
    if route == "chat":
        return {"model": "fault-model", "messages": [{"role": "user", "content": prompt}], "stream": stream}
    if route == "text":
        return {"model": "fault-model", "prompt": prompt, "stream": stream}
    if route == "resp":
        return {"model": "fault-model", "input": prompt, "stream": stream, **(TOOLS["resp"] if tools else {}),
                **(before or {})}
    if route == "msg":
        return {"model": "claude-fault-1", "max_tokens": 64, "stream": stream, **(TOOLS["msg"] if tools else {}),
                "messages": [*(before or {}).get("messages", []), {"role": "user", "content": prompt}]}
    return {"model": "fault-model", "input": prompt}


def _continuation(route: str, body: dict, answer: dict) -> dict:
    """What a next turn sends to continue `answer` (each tool call answered)."""
    if route == "resp":
        return {"previous_response_id": answer["id"]}
    uses = [{"type": "tool_result", "tool_use_id": b["id"], "content": "Lyon"} for b in answer["content"]
            if b["type"] == "tool_use"]
    said = [*body["messages"], {"role": "assistant", "content": answer["content"]}]
    return {"messages": [*said, {"role": "user", "content": uses}] if uses else said}


def _complete(route: str, parsed: dict) -> bool:
    if route == "resp":
        return parsed.get("object") == "response" and parsed.get("status") == "completed"
    if route == "msg":
        return parsed.get("type") == "message" and parsed.get("stop_reason") is not None
    return bool(parsed.get("data") if route == "embed" else parsed.get("choices"))


def _verdict(route: str, events: list[tuple[str | None, dict]], done: bool) -> str:
    """"ok", "error:<code>" or "lost:<why>" for a stream's events (done: [DONE] came)."""
    if route in ("chat", "text"):
        last = events[-1][1] if events else {}
        if isinstance(last.get("error"), dict):
            return f"error:stream:{last['error'].get('code') or last['error'].get('type')}"
        return "ok" if done else "lost:stream cut without an error event"
    if not events:
        return "lost:stream cut without an error event"
    name, last = events[-1]
    if name == "error":
        if route == "msg":
            code = _error_code(route, orjson.dumps(last))
        else:  # Responses: {"type": "error", "code", "message", "param"}
            code = str(last.get("code")) if last.get("type") == "error" and isinstance(last.get("message"), str) else None
        return f"error:stream:{code}" if code else "lost:an error event not in its wire's shape"
    if route == "resp":
        if name in ("response.failed", "response.incomplete"):
            return f"error:stream:{name}"
        return "ok" if name == "response.completed" else "lost:stream cut without an error event"
    return "ok" if name == "message_stop" else "lost:stream cut without an error event"


async def _events(content: aiohttp.StreamReader) -> tuple[list[tuple[str | None, dict]], bool]:
    """(event name, payload) of each event of a stream, and whether it ended in [DONE]."""
    events, name = [], None
    async for line in content:
        line = line.rstrip(b"\r\n")
        if line.startswith(b"event:"):
            name = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                return events, True
            events.append((name, orjson.loads(data)))
            name = None
    return events, False


async def _one(http: aiohttp.ClientSession, base: str, route: str, body: dict, tally: Tally,
               timeout: float) -> dict | None:
    """Send one request and classify its answer; the answer, when it is a complete one."""
    tally.sent += 1
    stream = body.get("stream") is True
    try:
        async with asyncio.timeout(timeout):
            async with http.post(base + ROUTES[route], json=body, headers=HEADERS.get(route)) as r:
                key = r.headers.get("x-detgate-key", "")
                cache = r.headers.get("x-detgate-cache", "?")
                if key:
                    tally.prompts.setdefault(key, (route, {**body, "stream": False}))
                if r.status != 200:
                    payload = await r.read()
                    code = _error_code(route, payload)
                    _count(tally, route, f"error:{r.status}:{code}" if code else f"lost:{r.status} without error body")
                    return None
                if not stream:
                    payload = await r.read()
                    parsed = orjson.loads(payload)
                    if route == "resp" and parsed.get("status") in ("failed", "incomplete"):
                        _count(tally, route, f"error:200:{parsed['status']}")  # passed on as the upstream sent it
                        return None
                    if not _complete(route, parsed):
                        _count(tally, route, "lost:200 without an answer")
                        return None
                    _count(tally, route, f"ok:{cache}")
                    if cache == "hit":
                        tally.hit_bodies[key].add(payload)
                    elif cache in ("miss", "coalesced"):
                        tally.first_fill.setdefault(key, payload)
                    return parsed
                events, done = await _events(r.content)
                verdict = _verdict(route, events, done)
                if verdict.startswith("lost"):  # what the stream ended with, for the report
                    tally.lost_examples.append((route, cache, [name for name, _ in events[-3:]], events[-1:]))
                _count(tally, route, verdict if verdict != "ok" else f"ok:{cache}")
                if verdict != "ok":
                    return None
                if cache == "hit":
                    tally.stream_hits[key].add(_stream_text(route, events))
                elif cache in ("miss", "coalesced"):
                    tally.first_stream.setdefault(key, _stream_text(route, events))
                final = events[-1][1]
                if route == "resp":
                    return final["response"]
                if route == "msg":
                    start = next(e for n, e in events if n == "message_start")["message"]
                    return {**start, "content": _blocks(events)}
                return final
    except TimeoutError:
        _count(tally, route, "lost:no answer within the client timeout")
    except (aiohttp.ClientError, orjson.JSONDecodeError, ValueError, KeyError, StopIteration) as exc:
        _count(tally, route, f"lost:{type(exc).__name__}")
    return None


def _count(tally: Tally, route: str, outcome: str) -> None:
    tally.outcomes[outcome] += 1
    tally.by_route[f"{route} {outcome.split(':')[0]}"] += 1


def _blocks(events: list[tuple[str | None, dict]]) -> list[dict]:
    """A Messages stream's content blocks, as its body would hold them."""
    blocks: dict[int, dict] = {}
    json_parts: dict[int, list[str]] = collections.defaultdict(list)
    for name, event in events:
        if name == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif name == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            if delta["type"] == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta["type"] == "input_json_delta":
                json_parts[event["index"]].append(delta["partial_json"])
    for index, parts in json_parts.items():
        blocks[index]["input"] = orjson.loads("".join(parts))
    return [blocks[i] for i in sorted(blocks)]


async def _load(args: argparse.Namespace, urls: list[str], tally: Tally, stop: asyncio.Event) -> None:
    rng = random.Random(args.seed)
    hot = [f"hot question {i}" for i in range(args.hot_keys)]
    todo = iter(range(args.requests))
    routes = list(ROUTES)
    weights = [float(w) for w in args.route_weights.split(",")]

    async def worker(http: aiohttp.ClientSession) -> None:
        before: tuple[str, dict] | None = None  # (route, what continues the last answer) for a chained turn
        for _ in todo:
            if stop.is_set():
                return
            prompt = rng.choice(hot) if rng.random() < args.hot_share else f"cold question {rng.getrandbits(40)}"
            chained = before is not None and rng.random() < args.chain_share
            route = before[0] if chained else rng.choices(routes, weights)[0]
            stream = route != "embed" and rng.random() < args.stream_share
            tools = route in TOOLS and rng.random() < args.tool_share
            body = _request(route, prompt, stream, tools, before[1] if chained else None)
            answer = await _one(http, rng.choice(urls), route, body, tally, args.client_timeout)
            before = (route, _continuation(route, body, answer)) if answer is not None and route in TOOLS else None

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(worker(http) for _ in range(args.concurrency)))


async def _chaos(redis: RedisProcess, args: argparse.Namespace, tally: Tally, stop: asyncio.Event,
                 kills: list[int]) -> None:
    """Kill -9 Redis after every `kill_every` requests sent; bring it back `down_for` later.

    Counted in requests, not seconds, so a run has the same number of outages however
    fast the machine is."""
    loop = asyncio.get_running_loop()
    next_kill = args.kill_every
    while not stop.is_set():
        if tally.sent < next_kill:
            await asyncio.sleep(0.01)
            continue
        await loop.run_in_executor(None, redis.kill9)
        kills.append(tally.sent)
        await asyncio.sleep(args.down_for)
        await loop.run_in_executor(None, redis.restart)
        next_kill = tally.sent + args.kill_every


async def _verify(urls: list[str], tally: Tally) -> dict:
    """Read every answered key back from the store and compare with what readers got."""
    keys = set(tally.hit_bodies) | set(tally.first_fill) | set(tally.stream_hits) | set(tally.first_stream)
    corrupt, missing, fill_differs, stream_differs = [], 0, 0, 0
    gate = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as http:
        async def read(key: str) -> tuple[str, bytes | None]:
            async with gate:
                return key, await _stored(http, urls[0], tally.prompts[key])

        for key, stored in await asyncio.gather(*(read(k) for k in keys)):
            hits = tally.hit_bodies.get(key, set())
            if stored is None:
                missing += 1
                if hits:
                    corrupt.append((key, "hits were served but the entry is gone"))
                continue
            route = tally.prompts[key][0]
            parsed = orjson.loads(stored)
            if "error" in parsed and parsed.get("object") != "response" or not _complete(route, parsed):
                corrupt.append((key, "entry is not a complete answer"))
                continue
            if any(h != stored for h in hits):
                corrupt.append((key, "a hit got bytes that differ from the entry"))
            content = _body_text(route, parsed)
            if any(t != content for t in tally.stream_hits.get(key, set())):
                corrupt.append((key, "a stream replay differs from the entry"))
            if key in tally.first_fill and tally.first_fill[key] != stored:
                fill_differs += 1
            if key in tally.first_stream and tally.first_stream[key] != content:
                stream_differs += 1

    return {"keys": len(keys), "corrupt": corrupt, "not_stored": missing, "fill_differs": fill_differs,
            "stream_differs": stream_differs}


async def _stored(http: aiohttp.ClientSession, base: str, route_body: tuple[str, dict]) -> bytes | None:
    """The stored answer for a request, read through the gateway (so its MAC is checked).

    A few tries: the gateway's first use of a pooled connection to the restarted Redis
    can fail, and it reads a failed lookup as a miss."""
    route, body = route_body
    for _ in range(3):
        async with http.post(base + ROUTES[route], json=body,
                             headers={**HEADERS.get(route, {}), "x-detgate-cache-control": "only-if-cached"}) as r:
            if r.status == 200:
                return await r.read()
        await asyncio.sleep(0.05)
    return None


def _scrape(bases: list[str], labels: dict[str, str]) -> dict[str, dict[str, float]]:
    """Counters summed over the gateways: metric name -> value of its label `labels[name]` -> sum."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, dict[str, float]] = {name: collections.Counter() for name in labels}
    for base in bases:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in out:
                    out[sample.name][sample.labels.get(labels[sample.name], "")] += sample.value
    return {name: dict(counts) for name, counts in out.items()}


def _wait_http(url: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--gateways", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--hot-keys", type=int, default=300)
    p.add_argument("--hot-share", type=float, default=0.8)
    p.add_argument("--stream-share", type=float, default=0.3, help="of all but embedding requests")
    p.add_argument("--tool-share", type=float, default=0.3, help="of Responses and Messages requests: offer a tool")
    p.add_argument("--chain-share", type=float, default=0.3,
                   help="after a complete Responses or Messages answer: the worker's next request continues it")
    p.add_argument("--route-weights", default="6,2,2,3,3", help="chat,completions,embeddings,responses,messages")
    p.add_argument("--faults", default=DEFAULT_FAULTS, help="upstream fault weights, fault=weight,...")
    p.add_argument("--stall-s", type=float, default=3.0)
    p.add_argument("--idle-timeout-s", type=float, default=1.0, help="the gateway's cut-off for a silent upstream")
    p.add_argument("--kill-every", type=int, default=2000, help="requests between Redis kill -9s (0: never)")
    p.add_argument("--down-for", type=float, default=1.0)
    p.add_argument("--client-timeout", type=float, default=60.0)
    p.add_argument("--max-seconds", type=float, default=600.0, help="stop sending after this long")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "load_faults")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(_run(args, Path(tmp)))
    _print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    args.out.with_suffix(".md").write_text(_markdown(report))


async def _run(args: argparse.Namespace, tmp: Path) -> dict:
    redis = RedisProcess(tmp / "redis", appendonly=True).start()
    procs: list[subprocess.Popen] = []
    try:
        up_port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "fakes" / "fault_upstream.py"), "--port", str(up_port), "--seed", str(args.seed),
             "--weights", args.faults, "--retry-after", "1", "--stall", str(args.stall_s), "--chunk-delay", "0"],
            stdout=subprocess.DEVNULL))
        ports = [free_port() for _ in range(args.gateways)]
        env = {**os.environ, "DETGATE_LOG_LEVEL": "WARNING"}
        for port in ports:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--port", str(port),
                 "--upstream", f"faulty=http://127.0.0.1:{up_port}/v1",
                 "--upstream", f"claude=http://127.0.0.1:{up_port}/v1#anthropic", "--redis-url", redis.url,
                 "--secret", "load-faults-secret", "--upstream-timeout-s", "10",
                 "--upstream-idle-timeout-s", str(args.idle_timeout_s)],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / f"gateway-{port}.log", "wb")))
        for port in ports:
            _wait_http(f"http://127.0.0.1:{port}/healthz")
        urls = [f"http://127.0.0.1:{port}" for port in ports]

        tally = Tally()
        stop = asyncio.Event()
        kills: list[int] = []
        chaos = asyncio.create_task(_chaos(redis, args, tally, stop, kills)) if args.kill_every > 0 else None
        started = time.monotonic()
        load = asyncio.create_task(_load(args, urls, tally, stop))
        try:
            await asyncio.wait_for(asyncio.shield(load), args.max_seconds)
        except TimeoutError:
            stop.set()
            await load
        elapsed = time.monotonic() - started
        stop.set()
        if chaos is not None:
            await chaos
        if not redis.running:
            redis.restart()
        verdict = await _verify(urls, tally)
        counters = _scrape(urls, {"detgate_upstream_retries_total": "reason", "detgate_cache_bypass_total": "reason",
                                  "detgate_upstream_requests_total": "code",
                                  "detgate_live_stream_unstored_total": "route"})
        crashed = [p.args[2:4] for p in procs if p.poll() is not None]
        return {
            "command": " ".join(["python3 bench/load_faults.py", *sys.argv[1:]]), "requests_sent": tally.sent, "seconds": round(elapsed, 1), "rps": round(tally.sent / elapsed, 1),
            "gateways": args.gateways, "concurrency": args.concurrency, "faults": args.faults,
            "redis_kills": len(kills), "answered_ok": tally.kind("ok:"), "errors": tally.kind("error:"),
            "lost": tally.kind("lost:"), "bypass": tally.outcomes["ok:bypass"],
            "outcomes": dict(sorted(tally.outcomes.items())),
            "keys_checked": verdict["keys"], "corrupt_entries": len(verdict["corrupt"]),
            "corrupt_examples": verdict["corrupt"][:5], "keys_not_stored": verdict["not_stored"],
            "first_fill_differs_from_entry": verdict["fill_differs"],
            "live_stream_differs_from_entry": verdict["stream_differs"],
            "live_streams_unstored": int(sum(counters["detgate_live_stream_unstored_total"].values())),
            "processes_died": crashed,
            "outcomes_by_route": dict(sorted(tally.by_route.items())), "lost_examples": tally.lost_examples[:5],
            "upstream_calls_by_status": counters["detgate_upstream_requests_total"],
            "upstream_retries_by_reason": counters["detgate_upstream_retries_total"],
            "gateway_bypass_by_reason": counters["detgate_cache_bypass_total"],
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        redis.stop()


def _rows(report: dict) -> list[tuple[str, str]]:
    rows = [("requests sent", report["requests_sent"]), ("seconds", report["seconds"]), ("requests/s", report["rps"]),
            ("gateway processes", report["gateways"]), ("redis kill -9", report["redis_kills"]),
            ("answered ok", report["answered_ok"]), ("well-formed errors", report["errors"]),
            ("LOST (must be 0)", report["lost"]), ("answered uncached while Redis was down (bypass)", report["bypass"]),
            ("keys checked", report["keys_checked"]),
            ("CORRUPT entries (must be 0)", report["corrupt_entries"]),
            ("answered keys not in the store", report["keys_not_stored"]),
            ("non-stream miss/coalesced answer != stored entry", report["first_fill_differs_from_entry"]),
            ("live stream miss/coalesced answer != stored entry", report["live_stream_differs_from_entry"]),
            ("  bound: live streams the gateways sent an answer the cache does not hold",
             report["live_streams_unstored"])]
    rows += [(f"  {k}", v) for k, v in report["outcomes"].items()]
    rows += [(f"route {k}", v) for k, v in report["outcomes_by_route"].items()]
    rows += [(f"upstream calls {k}", int(v)) for k, v in sorted(report["upstream_calls_by_status"].items())]
    rows += [(f"upstream retries {k}", int(v)) for k, v in sorted(report["upstream_retries_by_reason"].items())]
    return [(k, str(v)) for k, v in rows]


def _print(report: dict) -> None:
    rows = _rows(report)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _markdown(report: dict) -> str:
    lines = ["# load + fault run", "", f"`{report['command']}` ({os.cpu_count()} CPU cores)", "",
             f"faults: `{report['faults']}`, concurrency {report['concurrency']}", "",
             "| | |", "|---|---|"]
    lines += [f"| {k.strip()} | {v} |" for k, v in _rows(report)]
    lines += ["", "A live stream's headers (`x-detgate-cache: miss`) leave before its answer is stored. Its entry can "
              "differ from what it was sent only when its flight could not store that answer (the commit failed) or "
              "another replica's call stored first, which happens when a flight runs without the cross-replica lock: "
              "a failed lock call is given up on rather than failing the request, and the first use of a pooled "
              "connection after a Redis restart fails, seconds after the restart too. The gateways count each such "
              "stream (`detgate_live_stream_unstored_total`): the bound row. Fewer differ, as a later reader may "
              "still have been the first streamer the run recorded for its key. A whole answer in the same case is "
              "relabelled `bypass` before it goes out."]
    if report["lost_examples"]:
        lines += ["", "lost streams (route, cache, last events):", *[f"- `{example}`" for example in report["lost_examples"]]]
    if report["corrupt_examples"]:
        lines += ["", "corrupt examples:", *[f"- `{k}`: {why}" for k, why in report["corrupt_examples"]]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
