"""A real monitoring stack on loopback: redis-server, a fake upstream, `detgate backend` on
the CPU with a tiny random-weight checkpoint, `detgate serve` in front of both, and a
Prometheus server using the shipped scrape and alert config; plus a short mixed load.

The dashboard tests use it; `PYTHONPATH=tests python3 -m deploy.live_stack SECONDS` keeps
one running under load for that long (to look at, or to render screenshots from).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Iterator

import openai
import yaml
from fakes.loopback import LoopbackServer, free_port
from fakes.openai_upstream import Behaviour, FakeUpstream
from local_backend.random_checkpoint import numbered_tokenizer, write_checkpoint
from redis_process import RedisProcess

from .promql import ALERTS, DEPLOY

REPO = DEPLOY.parent
SCRAPE_INTERVAL_S = 1
UPSTREAM_DELAY_S = 0.15
SECRET = "live-stack-secret"
BACKEND_MODEL = "tiny"
# Small enough to load and answer in milliseconds on a CPU; real safetensors all the same.
TINY_QWEN3 = dict(arch="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, tie=True, rope_theta=1e4)


# Long enough for identical concurrent requests to overlap and be coalesced.
STEADY = Behaviour(delay_s=UPSTREAM_DELAY_S)
FAILING = Behaviour(delay_s=UPSTREAM_DELAY_S, fail_status=500)


@dataclasses.dataclass
class Stack:
    gateway: str
    backend: str
    prometheus: str
    upstream: FakeUpstream
    redis: RedisProcess
    logs: Path


def prometheus_config(gateway: str, backend: str) -> dict:
    """The shipped prometheus.yml, with the compose service discovery swapped for the
    loopback servers and intervals short enough for a test."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                        "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"}
    config["rule_files"] = [str(ALERTS)]
    targets = {"detgate-gateway": [gateway], "detgate-backend": [backend]}
    for job in config["scrape_configs"]:
        del job["dns_sd_configs"]
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
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
        redis = stack.enter_context(RedisProcess(tmp / "redis"))
        upstream = FakeUpstream(behaviour=STEADY)
        upstream_url = stack.enter_context(LoopbackServer(upstream.app())).url
        model = write_checkpoint(tmp / BACKEND_MODEL, TINY_QWEN3, numbered_tokenizer(512, ["<|im_start|>", "<|im_end|>"]),
                                 init_std=0.3)

        # Every finished request is audited, so the audit panels have something to show.
        backend = _spawn(stack, logs, "backend", [
            sys.executable, "-m", "gateway", "backend", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(backend_port), "--device", "cpu", "--audit-rate", "1", "--max-model-len", "256"])
        gateway = _spawn(stack, logs, "gateway", [
            sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(gateway_port),
            "--upstream", f"fake={upstream_url}/v1", "--upstream", f"local=http://127.0.0.1:{backend_port}/v1",
            "--redis-url", redis.url, "--secret", SECRET])
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        _wait_ready(f"{gateway_url}/healthz", gateway, logs / "gateway.log")
        # Importing torch alone can take tens of seconds on a cold, busy machine.
        _wait_ready(f"http://127.0.0.1:{backend_port}/healthz", backend, logs / "backend.log", timeout_s=120)

        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(f"127.0.0.1:{gateway_port}", f"127.0.0.1:{backend_port}")))
        prometheus = _spawn(stack, logs, "prometheus", [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        prom_url = f"http://127.0.0.1:{prom_port}"
        _wait_ready(f"{prom_url}/-/ready", prometheus, logs / "prometheus.log")
        yield Stack(gateway_url, f"http://127.0.0.1:{backend_port}", prom_url, upstream, redis, logs)


def wait_for_scrapes(n: int = 2) -> None:
    """Let Prometheus scrape (and evaluate rules) n more times."""
    time.sleep(n * SCRAPE_INTERVAL_S + 0.5)


async def drive(stack: Stack, rounds: int, tag: str) -> Counter:
    """A mixed load through the official client: misses then hits, streams, dirty input that
    canonicalization cleans, identical concurrent requests, embeddings, an upstream that
    fails, bad input, a cache bypass, and the backend behind the gateway. Returns how many answers of each x-detgate-cache
    status (or error status) it saw."""
    seen: Counter = Counter()
    client = openai.AsyncOpenAI(base_url=f"{stack.gateway}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.with_raw_response

    async def ask(content, model="fake-model", **kw):
        try:
            raw = await chat.create(model=model, messages=[{"role": "user", "content": content}], **kw)
        except openai.APIStatusError as exc:
            seen[exc.status_code] += 1
            return
        if kw.get("stream"):
            async for _ in raw.parse():
                pass
        seen[raw.headers["x-detgate-cache"]] += 1

    async with client:
        for r in range(rounds):
            for i in range(4):
                await ask(f"{tag} plain {r}.{i}")
                await ask(f"{tag} plain {r}.{i}")
            await ask(f"{tag} stream {r}", stream=True)
            await ask(f"{tag} stream {r}", stream=True)
            await ask(f"\ufeff{tag} dirty\r\n{r}\u200b", temperature=1.0)
            await ask(f"{tag} dirty\n{r}", temperature=1)
            await asyncio.gather(*(ask(f"{tag} together {r}") for _ in range(6)))
            for _ in range(2):
                raw = await client.embeddings.with_raw_response.create(model="fake-embed", input=f"{tag} embed {r}")
                seen[raw.headers["x-detgate-cache"]] += 1
            for stream in (False, False, True):
                await ask(f"t1 t2 t3 {tag} {r}", model=f"local/{BACKEND_MODEL}", max_tokens=8, stream=stream)
            stack.upstream.behaviour = FAILING
            await ask(f"{tag} doomed {r}")
            stack.upstream.behaviour = STEADY
            await ask(f"{tag} no-store {r}", extra_headers={"x-detgate-cache-control": "no-store"})
            try:
                await chat.create(model="fake-model", messages="not a list of messages")
            except openai.BadRequestError as exc:
                seen[exc.status_code] += 1
    return seen


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 300
    with running() as live:
        print(f"gateway {live.gateway}\nprometheus {live.prometheus}", flush=True)
        end = time.monotonic() + seconds
        for n in itertools.count():
            if time.monotonic() > end:
                break
            print(dict(asyncio.run(drive(live, 1, f"demo{os.getpid()}-{n}"))), flush=True)
            time.sleep(1)
