"""A real monitoring stack on loopback: redis-server, fake upstreams, `detgate backend` on
the CPU with a tiny random-weight checkpoint, `detgate serve` in front of them all, and a
Prometheus server using the shipped scrape and alert config; plus a load that makes every
gateway panel move through real behaviour rather than made-up numbers.

The upstreams, each a reused fake from tests/fakes:
  fake    random text, slow enough to coalesce; told to fail now and then (500s)
  noisy   flips its yes/no answer and sometimes breaks its JSON: votes and schema retries
  flaky   500s and 429s at random (retries), and a scripted run of 500s (circuit breaker)
  pinned  one fixed answer, probed by a canary, until its "model update" (drift)
Tenant `batch` is rate limited, every upstream has only a few call slots (saturation), an
entry is overwritten with another's in Redis (tamper), and Redis is killed (bypass).

The dashboard tests use it; `PYTHONPATH=tests python3 -m deploy.live_stack SECONDS` keeps
one running under that load for that long (to look at, or to render screenshots from).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import itertools
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterator

import openai
import redis
import yaml
from fakes.faults import FaultPlan, Faults
from fakes.loopback import LoopbackServer, free_port
from fakes.noisy_upstream import NoisyUpstream
from fakes.openai_upstream import Behaviour, FakeUpstream, Noise
from local_backend.random_checkpoint import numbered_tokenizer, write_checkpoint
from redis_process import RedisProcess

from .promql import ALERTS, DEPLOY

REPO = DEPLOY.parent
SCRAPE_INTERVAL_S = 1
UPSTREAM_DELAY_S = 0.15
SECRET = "live-stack-secret"
APP_KEY, BATCH_KEY = "live-app-key", "live-batch-key"
OPERATOR_TOKEN = "live-operator-token"  # what Prometheus scrapes the gateway with, as deploy/ does
BACKEND_MODEL = "tiny"
# Small enough to load and answer in milliseconds on a CPU; real safetensors all the same.
TINY_QWEN3 = dict(arch="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, tie=True, rope_theta=1e4)
# Few enough call slots per upstream that a burst of distinct requests runs out of them;
# the short queue times out before a slow upstream call frees a slot.
UPSTREAM_SLOTS, UPSTREAM_QUEUE, QUEUE_TIMEOUT_S = 4, 2, 0.05
BREAKER_FAILURES = 5
BATCH_RATE_LIMIT = "1/2"  # per second / burst: a burst of four from tenant batch loses two
VERDICT = {"type": "json_schema", "json_schema": {"name": "verdict", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "note": {"type": "string"}},
    "required": ["answer"]}}}
# The gateway's config file: what has no flag. Canaries run every second; votes compare
# the noisy upstream's answers by their /answer only, as its notes always differ.
GATEWAY_TOML = """
canary_interval_s = 1.0

[[canaries]]
name = "greeting"
model = "pinned/greeter"
body = { messages = [{ role = "user", content = "Say hello." }] }

[strategies."*judge*"]
extractor = { json_pointer = "/answer" }
""" + f"""
[tenants.app]
key = "{APP_KEY}"
refresh = true  # may send no-store, counted as allowed

[tenants.batch]
key = "{BATCH_KEY}"
"""

# Long enough for identical concurrent requests to overlap and be coalesced.
STEADY = Behaviour(delay_s=UPSTREAM_DELAY_S)
FAILING = Behaviour(delay_s=UPSTREAM_DELAY_S, fail_status=500)
# Its provider's filter cut the answer: served, and not stored (store_finish).
FILTERED = Behaviour(delay_s=UPSTREAM_DELAY_S, finish="content_filter")
GREETINGS = ("Hello! How can I help you today?", "Hi there! What can I do for you?", "Hey! What do you need?")


def pinned_build(n: int) -> Behaviour:
    """The pinned model as its provider serves it after n updates: one fixed answer per build."""
    return Behaviour(answer=GREETINGS[n % len(GREETINGS)], fingerprint=f"fp_pinned_{n:04d}")


@dataclasses.dataclass
class Stack:
    gateway: str
    backend: str
    prometheus: str
    upstream: FakeUpstream
    noisy: NoisyUpstream
    flaky: Faults
    pinned: FakeUpstream
    redis: RedisProcess
    logs: Path


def prometheus_config(gateway: str, backend: str, token_file: Path) -> dict:
    """The shipped prometheus.yml, with the compose service discovery swapped for the
    loopback servers, intervals short enough for a test, and the operator token read
    where this stack wrote it rather than where compose mounts it."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                        "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"}
    config["rule_files"] = [str(ALERTS)]
    targets = {"detgate-gateway": [gateway], "detgate-backend": [backend]}
    for job in config["scrape_configs"]:
        del job["dns_sd_configs"]
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token_file)
    return config


def _spawn(stack: contextlib.ExitStack, logs: Path, name: str, argv: list[str]) -> subprocess.Popen:
    log = stack.enter_context(open(logs / f"{name}.log", "wb"))
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    stack.callback(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
            if response.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s}s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def running() -> Iterator[Stack]:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="detgate-live-")))
        logs = tmp / "logs"
        logs.mkdir()
        gateway_port, backend_port, prom_port = free_port(), free_port(), free_port()
        redis_server = stack.enter_context(RedisProcess(tmp / "redis"))
        upstream = FakeUpstream(behaviour=STEADY)
        noisy = NoisyUpstream(p_flip=0.3, p_invalid=0.3, seed=7)
        # A short Retry-After keeps retried 429s quick.
        flaky = Faults(FaultPlan(weights={"ok": 6, "500": 2, "429": 2}, retry_after=0.05), seed=11)
        pinned = FakeUpstream(behaviour=pinned_build(0))
        urls = {name: stack.enter_context(LoopbackServer(app)).url for name, app in (
            ("fake", upstream.app()), ("noisy", noisy.app()), ("flaky", FakeUpstream(Noise(seed=11), faults=flaky).app()),
            ("pinned", pinned.app()))}
        model = write_checkpoint(tmp / BACKEND_MODEL, TINY_QWEN3, numbered_tokenizer(512, ["<|im_start|>", "<|im_end|>"]),
                                 init_std=0.3)
        config = tmp / "detgate.toml"
        config.write_text(GATEWAY_TOML)

        # Every finished request is audited, so the audit panels have something to show.
        backend = _spawn(stack, logs, "backend", [
            sys.executable, "-m", "gateway", "backend", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(backend_port), "--device", "cpu", "--audit-rate", "1", "--max-model-len", "256"])
        gateway = _spawn(stack, logs, "gateway", [
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(gateway_port), *(f for name, url in urls.items() for f in ("--upstream", f"{name}={url}/v1")),
            "--upstream", f"local=http://127.0.0.1:{backend_port}/v1", "--redis-url", redis_server.url,
            "--secret", SECRET, "--operator-token", OPERATOR_TOKEN,
            "--rate-limit", f"batch={BATCH_RATE_LIMIT}", "--upstream-concurrency", str(UPSTREAM_SLOTS),
            "--upstream-queue", str(UPSTREAM_QUEUE), "--upstream-queue-timeout-s", str(QUEUE_TIMEOUT_S),
            "--breaker-failures", str(BREAKER_FAILURES)])
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        _wait_ready(f"{gateway_url}/healthz", gateway, logs / "gateway.log")
        # Importing torch alone can take tens of seconds on a cold, busy machine.
        _wait_ready(f"http://127.0.0.1:{backend_port}/healthz", backend, logs / "backend.log", timeout_s=120)

        prom_config = tmp / "prometheus.yml"
        token_file = tmp / "operator_token"
        token_file.write_text(OPERATOR_TOKEN)
        prom_config.write_text(yaml.safe_dump(prometheus_config(f"127.0.0.1:{gateway_port}", f"127.0.0.1:{backend_port}",
                                                                token_file)))
        prometheus = _spawn(stack, logs, "prometheus", [
            "prometheus", f"--config.file={prom_config}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        prom_url = f"http://127.0.0.1:{prom_port}"
        _wait_ready(f"{prom_url}/-/ready", prometheus, logs / "prometheus.log")
        yield Stack(gateway_url, f"http://127.0.0.1:{backend_port}", prom_url, upstream, noisy, flaky, pinned,
                    redis_server, logs)


def wait_for_scrapes(n: int = 2) -> None:
    """Let Prometheus scrape (and evaluate rules) n more times."""
    time.sleep(n * SCRAPE_INTERVAL_S + 0.5)


class Client:
    """The official client for one tenant, counting what each kind of request got back:
    seen[(kind, status)], where status is x-detgate-cache or the HTTP error status."""

    def __init__(self, stack: Stack, api_key: str, seen: Counter):
        self.client = openai.AsyncOpenAI(base_url=f"{stack.gateway}/v1", api_key=api_key, max_retries=0)
        self.seen = seen

    async def ask(self, kind: str, content, model: str = "fake-model", **kw) -> openai.types.chat.ChatCompletion | None:
        try:
            raw = await self.client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": content}], **kw)
        except openai.APIStatusError as exc:
            self.seen[kind, exc.status_code] += 1
            return None
        self.seen[kind, raw.headers["x-detgate-cache"]] += 1
        if kw.get("stream"):
            async for _ in raw.parse():
                pass
            return None
        return raw

    async def close(self) -> None:
        await self.client.close()


async def drive(stack: Stack, rounds: int, tag: str) -> Counter:
    """A mixed load through the official client: misses then hits, streams, dirty input that
    canonicalization cleans, default sampling parameters the policy rewrites, prompts with
    today's date and a UUID, identical concurrent requests, embeddings, majority votes and
    schema-checked answers from the noisy upstream, retried faults, a canary's upstream,
    a burst past the upstream slots, a burst past tenant batch's rate limit, an upstream
    that fails, an answer its provider's filter cut, bad input, a cache bypass, and the
    backend behind the gateway."""
    seen: Counter = Counter()
    app, batch = Client(stack, APP_KEY, seen), Client(stack, BATCH_KEY, seen)
    ask = app.ask
    try:
        for r in range(rounds):
            for i in range(4):
                await ask("plain", f"{tag} plain {r}.{i}")
                await ask("plain", f"{tag} plain {r}.{i}")
            await ask("stream", f"{tag} stream {r}", stream=True)
            await ask("stream", f"{tag} stream {r}", stream=True)
            await ask("dirty", f"\ufeff{tag} dirty\r\n{r}\u200b", temperature=1.0)
            await ask("dirty", f"{tag} dirty\n{r}", temperature=1)
            await ask("hidden", f"{tag} what happened on {datetime.date.today().isoformat()}? request {uuid.uuid4()}")
            await asyncio.gather(*(ask("together", f"{tag} together {r}") for _ in range(6)))
            for _ in range(2):
                raw = await app.client.embeddings.with_raw_response.create(model="fake-embed", input=f"{tag} embed {r}")
                seen["embed", raw.headers["x-detgate-cache"]] += 1
            for _ in range(2):
                await ask("vote", f"{tag} is it so? {r}", model="noisy/judge", extra_headers={"x-detgate-vote": "3"})
            for i in range(3):
                await ask("schema", f"{tag} verdict {r}.{i}", model="noisy/judge", response_format=VERDICT)
            for i in range(4):
                await ask("flaky", f"{tag} flaky {r}.{i}", model="flaky/model")
            await ask("pinned", f"{tag} greet {r}", model="pinned/greeter")
            await asyncio.gather(*(ask("burst", f"{tag} burst {r}.{i}") for i in range(2 * UPSTREAM_SLOTS)))
            await asyncio.gather(*(batch.ask("batch", f"{tag} batch {r}.{i}") for i in range(4)))
            for stream in (False, False, True):
                await ask("local", f"t1 t2 t3 {tag} {r}", model=f"local/{BACKEND_MODEL}", max_tokens=8, stream=stream)
            stack.upstream.behaviour = FAILING
            await ask("doomed", f"{tag} doomed {r}")
            stack.upstream.behaviour = FILTERED
            await ask("filtered", f"{tag} filtered {r}")
            stack.upstream.behaviour = STEADY
            await ask("no-store", f"{tag} no-store {r}", extra_headers={"x-detgate-cache-control": "no-store"})
            try:
                await app.client.chat.completions.create(model="fake-model", messages="not a list of messages")
            except openai.BadRequestError as exc:
                seen["bad", exc.status_code] += 1
    finally:
        await app.close()
        await batch.close()
    return seen


async def incidents(stack: Stack, tag: str, update: int) -> Counter:
    """What goes wrong once in a while, each through its real cause: the pinned model gets
    its `update`-th update from its provider (a new fingerprint, and the canary's answer
    changes), the flaky upstream fails often enough in a row to open its circuit breaker, and
    one stored entry is overwritten with another's (which its MAC must catch)."""
    seen: Counter = Counter()
    app = Client(stack, APP_KEY, seen)
    try:
        stack.pinned.behaviour = pinned_build(update)
        await app.ask("drifted", f"{tag} greet after update {update}", model="pinned/greeter")

        # Every attempt of two requests fails: the breaker opens and refuses the third.
        stack.flaky.script.extend(["500"] * BREAKER_FAILURES * 2)
        for i in range(3):
            await app.ask("breaker", f"{tag} breaker {update}.{i}", model="flaky/model")
        stack.flaky.script.clear()

        first = await app.ask("tamper", f"{tag} original {update}")
        second = await app.ask("tamper", f"{tag} target {update}")
        store = redis.Redis.from_url(stack.redis.url)
        try:
            # The store's entry names hold the key the gateway reports; the layout around it is its own.
            (source,) = store.scan_iter(match=f"*{first.headers['x-detgate-key']}*")
            (target,) = store.scan_iter(match=f"*{second.headers['x-detgate-key']}*")
            store.set(target, store.get(source))
        finally:
            store.close()
        await asyncio.sleep(1.2)  # past the near cache's 1 s reuse: the next read comes from Redis
        await app.ask("tampered", f"{tag} target {update}")
    finally:
        await app.close()
    return seen


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 300
    with running() as live:
        print(f"gateway {live.gateway}\nprometheus {live.prometheus}", flush=True)
        start = time.monotonic()
        # Incidents at a third and at half of the run, Redis lost for the last fifth: the
        # screenshots show each panel before and after.
        updates = 0
        for n in itertools.count():
            elapsed = time.monotonic() - start
            if elapsed > seconds:
                break
            if updates < 2 and elapsed > seconds * (updates + 2) / 6:
                updates += 1
                print("incidents", dict(asyncio.run(incidents(live, f"demo{os.getpid()}", updates))), flush=True)
            if live.redis.running and elapsed > 0.8 * seconds:
                live.redis.kill9()
                print("redis killed", flush=True)
            print(dict(asyncio.run(drive(live, 1, f"demo{os.getpid()}-{n}"))), flush=True)
            time.sleep(1)
