"""Load + fault run: many requests through several gateway processes while things break.

Starts a real redis-server (append-only, fsync always, so what was stored survives a
kill -9), the fault-injecting upstream in its own process, and N `detgate serve`
processes sharing that Redis. Then sends a bounded number of requests over loopback —
chat completions, completions and embeddings, chat and completions partly streamed,
drawn from a small hot set and a large cold set of prompts so there are hits, misses and
coalesced calls — while Redis is killed with SIGKILL and restarted every so many
requests, and the upstream returns 500s, 429s, resets, slow first bytes, stalls (cut by
the gateway's idle timeout) and broken streams and bodies.

Every answer is classified:
    ok          200 with a complete answer (a stream ends in [DONE])
    error       a well-formed OpenAI error: non-2xx with {"error": {...}}, or a stream
                that ends with an error event
    lost        anything else: a connection the gateway dropped, a stream cut without an
                error event, a body that is neither an answer nor an error, no answer
                within --client-timeout
Answers given while Redis was down must say `x-detgate-cache: bypass`; the run counts them.
After the load, every key that was answered is read back through the gateway with
`x-detgate-cache-control: only-if-cached`, and an entry is counted corrupt when it is
not a complete answer, or when any earlier hit for its key got different bytes (the
entry changed after someone read it).

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

DEFAULT_FAULTS = "ok=86,500=4,429=3,reset=2,broken=2,stall=2,slow_first_byte=1"
ROUTES = {"chat": "/v1/chat/completions", "text": "/v1/completions", "embed": "/v1/embeddings"}


@dataclass
class Tally:
    sent: int = 0
    outcomes: collections.Counter = field(default_factory=collections.Counter)  # "ok:hit", "error:502:code", "lost:why"
    # key -> bodies that non-stream hits returned; key -> the first non-stream miss/coalesced body
    hit_bodies: dict = field(default_factory=lambda: collections.defaultdict(set))
    first_fill: dict = field(default_factory=dict)
    stream_hits: dict = field(default_factory=lambda: collections.defaultdict(set))
    first_stream: dict = field(default_factory=dict)  # key -> text of the first streamed miss/coalesced
    prompts: dict = field(default_factory=dict)  # key -> (route, prompt) it was signed from, to read it back

    def kind(self, prefix: str) -> int:
        return sum(n for k, n in self.outcomes.items() if k.startswith(prefix))


def _error_code(payload: bytes) -> str | None:
    """The error code of an OpenAI-shaped error body, or None when it is not one."""
    try:
        err = orjson.loads(payload)["error"]
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err.get("code") or err.get("type") or "none")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return None


def _stream_text(events: list[bytes]) -> str:
    """The answer's text from stream events, chat (delta.content) or completion (text)."""
    out = []
    for event in events:
        for choice in orjson.loads(event)["choices"] or []:
            out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(out)


def _body_text(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _request(route: str, prompt: str, stream: bool) -> dict:
    if route == "chat":
        return {"model": "fault-model", "messages": [{"role": "user", "content": prompt}], "stream": stream}
    if route == "text":
        return {"model": "fault-model", "prompt": prompt, "stream": stream}
    return {"model": "fault-model", "input": prompt}


def _complete(route: str, parsed: dict) -> bool:
    return bool(parsed.get("data") if route == "embed" else parsed.get("choices"))


async def _one(http: aiohttp.ClientSession, base: str, route: str, prompt: str, stream: bool, tally: Tally,
               timeout: float) -> None:
    tally.sent += 1
    try:
        async with asyncio.timeout(timeout):
            async with http.post(base + ROUTES[route], json=_request(route, prompt, stream)) as r:
                key = r.headers.get("x-detgate-key", "")
                cache = r.headers.get("x-detgate-cache", "?")
                if key:
                    tally.prompts.setdefault(key, (route, prompt))
                if r.status != 200:
                    payload = await r.read()
                    code = _error_code(payload)
                    tally.outcomes[f"error:{r.status}:{code}" if code else f"lost:{r.status} without error body"] += 1
                    return
                if not stream:
                    payload = await r.read()
                    parsed = orjson.loads(payload)
                    if not _complete(route, parsed):
                        tally.outcomes["lost:200 without an answer"] += 1
                        return
                    tally.outcomes[f"ok:{cache}"] += 1
                    if cache == "hit":
                        tally.hit_bodies[key].add(payload)
                    elif cache in ("miss", "coalesced"):
                        tally.first_fill.setdefault(key, payload)
                    return
                events, done, error = [], False, None
                async for line in r.content:
                    line = line.rstrip(b"\r\n")
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    code = _error_code(data)
                    if code is not None:
                        error = code
                        break
                    events.append(data)
                if error is not None:
                    tally.outcomes[f"error:stream:{error}"] += 1
                elif done:
                    tally.outcomes[f"ok:{cache}"] += 1
                    if cache == "hit":
                        tally.stream_hits[key].add(_stream_text(events))
                    elif cache in ("miss", "coalesced"):
                        tally.first_stream.setdefault(key, _stream_text(events))
                else:
                    tally.outcomes["lost:stream cut without an error event"] += 1
    except TimeoutError:
        tally.outcomes["lost:no answer within the client timeout"] += 1
    except (aiohttp.ClientError, orjson.JSONDecodeError, ValueError) as exc:
        tally.outcomes[f"lost:{type(exc).__name__}"] += 1


async def _load(args: argparse.Namespace, urls: list[str], tally: Tally, stop: asyncio.Event) -> None:
    rng = random.Random(args.seed)
    hot = [f"hot question {i}" for i in range(args.hot_keys)]
    todo = iter(range(args.requests))
    routes = list(ROUTES)
    weights = [float(w) for w in args.route_weights.split(",")]

    async def worker(http: aiohttp.ClientSession) -> None:
        for _ in todo:
            if stop.is_set():
                return
            prompt = rng.choice(hot) if rng.random() < args.hot_share else f"cold question {rng.getrandbits(40)}"
            route = rng.choices(routes, weights)[0]
            stream = route != "embed" and rng.random() < args.stream_share
            await _one(http, rng.choice(urls), route, prompt, stream, tally, args.client_timeout)

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
            if "error" in parsed or not _complete(route, parsed):
                corrupt.append((key, "entry is not a complete answer"))
                continue
            if any(h != stored for h in hits):
                corrupt.append((key, "a hit got bytes that differ from the entry"))
            content = None if route == "embed" else _body_text(parsed)
            if any(t != content for t in tally.stream_hits.get(key, set())):
                corrupt.append((key, "a stream replay differs from the entry"))
            if key in tally.first_fill and tally.first_fill[key] != stored:
                fill_differs += 1
            if key in tally.first_stream and tally.first_stream[key] != content:
                stream_differs += 1
    return {"keys": len(keys), "corrupt": corrupt, "not_stored": missing, "fill_differs": fill_differs,
            "stream_differs": stream_differs}


async def _stored(http: aiohttp.ClientSession, base: str, route_prompt: tuple[str, str]) -> bytes | None:
    """The stored answer for a prompt, read through the gateway (so its MAC is checked).

    A few tries: the gateway's first use of a pooled connection to the restarted Redis
    can fail, and it reads a failed lookup as a miss."""
    route, prompt = route_prompt
    for _ in range(3):
        async with http.post(base + ROUTES[route], json=_request(route, prompt, False),
                             headers={"x-detgate-cache-control": "only-if-cached"}) as r:
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
    p.add_argument("--stream-share", type=float, default=0.3, help="of chat and completion requests")
    p.add_argument("--route-weights", default="6,2,2", help="chat,completions,embeddings")
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
                 "--upstream", f"faulty=http://127.0.0.1:{up_port}/v1", "--redis-url", redis.url,
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
                                  "detgate_upstream_requests_total": "code"})
        crashed = [p.args[2:4] for p in procs if p.poll() is not None]
        return {
            "requests_sent": tally.sent, "seconds": round(elapsed, 1), "rps": round(tally.sent / elapsed, 1),
            "gateways": args.gateways, "concurrency": args.concurrency, "faults": args.faults,
            "redis_kills": len(kills), "answered_ok": tally.kind("ok:"), "errors": tally.kind("error:"),
            "lost": tally.kind("lost:"), "bypass": tally.outcomes["ok:bypass"],
            "outcomes": dict(sorted(tally.outcomes.items())),
            "keys_checked": verdict["keys"], "corrupt_entries": len(verdict["corrupt"]),
            "corrupt_examples": verdict["corrupt"][:5], "keys_not_stored": verdict["not_stored"],
            "first_fill_differs_from_entry": verdict["fill_differs"],
            "live_stream_differs_from_entry": verdict["stream_differs"], "processes_died": crashed,
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
            ("live stream miss/coalesced answer != stored entry", report["live_stream_differs_from_entry"])]
    rows += [(f"  {k}", v) for k, v in report["outcomes"].items()]
    rows += [(f"upstream calls {k}", int(v)) for k, v in sorted(report["upstream_calls_by_status"].items())]
    rows += [(f"upstream retries {k}", int(v)) for k, v in sorted(report["upstream_retries_by_reason"].items())]
    return [(k, str(v)) for k, v in rows]


def _print(report: dict) -> None:
    rows = _rows(report)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _markdown(report: dict) -> str:
    lines = ["# load + fault run", "", f"faults: `{report['faults']}`, concurrency {report['concurrency']}", "",
             "| | |", "|---|---|"]
    lines += [f"| {k.strip()} | {v} |" for k, v in _rows(report)]
    if report["corrupt_examples"]:
        lines += ["", "corrupt examples:", *[f"- `{k}`: {why}" for k, why in report["corrupt_examples"]]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
