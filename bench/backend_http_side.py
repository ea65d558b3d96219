"""The HTTP side's capacity: generated tokens/s the server's handlers hand out when the engine
takes no time at all.

    python3 bench/backend_http_side.py [--concurrency 1 32 256] [--tokens 128] [--profile]

Runs on the CPU. The server (`local_backend.server` over an EngineClient, in a process of its
own as the CLI runs it) gets a stand-in engine: a thread whose every step gives each running
request one token, its lot sent through the engine's Outbox (at most one lot ahead of the
handlers) and pickled and unpickled as through the pipe. The client, in this process, sends --concurrency requests
of random 128-token prompts at once, non-streaming and then streaming, and counts generated
tokens per second. With the engine in its own process, this is the ceiling the HTTP side puts
on a step of that many sequences: 256 requests at 30,000 tokens/s need a lot handled in
8.5 ms. --profile prints the server's hottest functions under cProfile. Writes
backend_http_side.{json,md}.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import multiprocessing
import pickle
import platform
import pstats
import queue
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from local_backend.config import EngineConfig  # noqa: E402
from local_backend.engine.messages import EngineInfo, Event, Sample, StepStats  # noqa: E402
from local_backend.engine.outbox import Outbox  # noqa: E402
from backend_determinism import Client  # noqa: E402  (this script's folder is on sys.path)
from backend_latency import streamed  # noqa: E402
from backend_throughput import greedy_wave  # noqa: E402
from md_table import markdown_table  # noqa: E402

SHAPE = dict(arch="qwen3", vocab_size=151936, hidden_size=64, intermediate_size=128, num_layers=1,
             num_heads=4, num_kv_heads=2, head_dim=16, tie=True, rope_theta=10000.0)   # the 0.6B's vocabulary


class InstantEngine:
    """A link (engine_thread.py's interface) over an engine that takes no time: each step gives
    every running request a token, and its lot goes out through the engine's own Outbox (so at
    most one lot ahead of the handlers), pickled and unpickled as through the pipe."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.info = EngineInfo("fp_bench", "-", "-", "cpu", "bfloat16", 1 << 20, 16, 4096, 1024, False)
        self.alive = True
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox = Outbox()

    def start(self, loop, deliver, died) -> None:
        self._outbox.connect(lambda lot: loop.call_soon_threadsafe(deliver, pickle.loads(pickle.dumps(lot))))
        threading.Thread(target=self._run, daemon=True).start()

    def send(self, command: tuple) -> None:
        self._inbox.put(command)

    def was_read(self) -> None:
        self._outbox.was_read()

    def stop(self) -> None:
        self.send(("stop",))

    def _run(self) -> None:
        running: dict[int, list] = {}   # request id -> [tokens left, rng]
        while True:
            block = not running
            try:
                while True:
                    command = self._inbox.get(block=block)
                    block = False
                    if command[0] == "stop":
                        return
                    if command[0] == "add":
                        running[command[1]] = [command[3].max_tokens, random.Random(command[1])]
                    else:
                        running.pop(command[1], None)
            except queue.Empty:
                pass
            lot = self._outbox.lot
            for request_id, state in list(running.items()):
                state[0] -= 1
                token = state[1].randrange(SHAPE["vocab_size"] - 8)
                lot.events.append((request_id, Event(Sample(token), "length" if state[0] == 0 else None)))
                if state[0] == 0:
                    del running[request_id]
            lot.steps.append(StepStats(len(lot.events), len(lot.events), 0.0, 0, 0, 0, 0, {}, 0.0))
            self._outbox.send()


def serve(model: str, port: int, profile: bool, ready, done) -> None:
    """The server process: the HTTP side over the stand-in engine until `done` is set."""
    from aiohttp import web

    from local_backend.engine.client import EngineClient
    from local_backend.metrics import Metrics
    from local_backend.server import make_app

    async def main():
        runner = web.AppRunner(make_app(EngineClient(InstantEngine(EngineConfig(model=model)), Metrics()), "bench"),
                               handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, done.wait)
        await runner.cleanup()

    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    asyncio.run(main())
    if prof:
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue())


async def wave(url: str, c: int, tokens: int, stream: bool) -> float:
    """Seconds for c requests at once, answered in one body or streamed."""
    rng = random.Random(c)
    async with Client(url, SHAPE["vocab_size"]) as client:
        await client.complete(client.prompt(rng, 128), 8, temperature=0)   # warm-up
        if not stream:
            return await greedy_wave(client, rng, c, 128, tokens)
        prompts = [client.prompt(rng, 128) for _ in range(c)]
        start = time.perf_counter()
        await asyncio.gather(*(streamed(client, p, tokens) for p in prompts))
        return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=8791)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--streamed", choices=["no", "yes", "both"], default="both")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    from local_backend.random_checkpoint import numbered_tokenizer, write_checkpoint
    model = write_checkpoint(Path(tempfile.mkdtemp()) / "m", SHAPE, numbered_tokenizer(SHAPE["vocab_size"], []),
                             device="cpu")
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    server = context.Process(target=serve, args=(str(model), args.port, args.profile, ready, done))
    server.start()
    ready.wait(60)
    url = f"http://127.0.0.1:{args.port}"
    rows = []
    for stream in {"no": (False,), "yes": (True,), "both": (False, True)}[args.streamed]:
        for c in args.concurrency:
            seconds = min(asyncio.run(wave(url, c, args.tokens, stream)) for _ in range(args.repeats))
            rows.append({"streamed": stream, "concurrent": c, "tok_per_s": round(c * args.tokens / seconds),
                         "us_per_token": round(seconds / (c * args.tokens) * 1e6, 2)})
    done.set()
    server.join()
    env = {"python": platform.python_version(), "machine": platform.processor() or platform.machine(),
           "tokens": args.tokens, "best_of": args.repeats}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "backend_http_side.json").write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    table = markdown_table(rows)
    (out / "backend_http_side.md").write_text(
        f"`python3 bench/backend_http_side.py` ({env})\n\n# The HTTP side's capacity, engine taking no time\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
