"""What majority voting buys against a black-box provider that flips its answer.

The provider (tests/fakes/noisy_upstream.py) answers "yes", flipped to "no" with
probability p, ignoring the seed, with fresh surrounding text every call. For p in
{0.1, 0.3} and a vote of k in {1, 3, 5}, each of `--trials` distinct questions is asked
cold twice, through two gateways that share nothing (each its own empty in-process
store), the way two CI runs or two environments would first meet it. Reported: how
often the two cold answers agree, how often an answer is the provider's usual one, and
upstream calls per cold answer; k=1 (no vote) is the baseline in the same run. Beside
each measurement, the closed form: with q the chance that a vote elects "yes",
agreement = q^2 + (1-q)^2; expected calls follow the gateway's wave rule over all 2^k
answer sequences.

    python3 bench/blackbox_vote.py [--trials 400]

Writes bench/results/blackbox_vote.md and .json.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import platform
import sys
import time
from pathlib import Path

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fakes.loopback import LoopbackServer  # noqa: E402
from fakes.noisy_upstream import NoisyUpstream  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import Settings  # noqa: E402

RESULTS = REPO / "bench" / "results"
PS = (0.1, 0.3)
KS = (1, 3, 5)
CONCURRENCY = 16


def p_elects_usual(p: float, k: int) -> float:
    """The chance that a majority of k independent answers is the usual one."""
    return sum(math.comb(k, j) * (1 - p) ** j * p ** (k - j) for j in range(k // 2 + 1, k + 1))


def wave_calls(answers: tuple[bool, ...], k: int) -> int:
    """Calls the gateway's wave rule makes when the i-th voter answers answers[i]
    (gateway/strategies/voting.py: launch just enough voters that the leader could reach a
    majority; stop once one group has it or all k are in)."""
    launched = 0
    while launched < k:
        yes = sum(answers[:launched])
        lead = max(yes, launched - yes)
        if lead > k // 2:
            break
        launched += min(k // 2 + 1 - lead, k - launched)
    return launched


def expected_calls(p: float, k: int) -> float:
    return sum(math.prod((1 - p) if a else p for a in seq) * wave_calls(seq, k)
               for seq in itertools.product((True, False), repeat=k))


async def cold_answers(url: str, k: int, trials: int, tag: str) -> list[str]:
    """The answer each question gets on its first ask through the gateway at `url`."""
    limit = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession() as session:
        async def ask(i: int) -> str:
            body = {"model": "m", "messages": [{"role": "user", "content": f"{tag} question {i}: is it so?"}]}
            async with limit, session.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                                           headers={"Content-Type": "application/json", "x-detgate-vote": str(k)}) as r:
                reply = orjson.loads(await r.read())
                if r.status != 200 or r.headers["x-detgate-cache"] != "miss":
                    raise RuntimeError(f"expected a cold answer, got {r.status} {reply}")
                return orjson.loads(reply["choices"][0]["message"]["content"])["answer"]

        return list(await asyncio.gather(*(ask(i) for i in range(trials))))


def gateway(upstream_url: str) -> LoopbackServer:
    settings = Settings.model_validate({
        "upstreams": [{"name": "noisy", "url": upstream_url + "/v1"}], "secret": "bench-secret", "log_level": "WARNING",
        "strategies": {"*": {"extractor": {"json_pointer": "/answer"}}}, "breaker_failures": 0})
    return LoopbackServer(create_app(settings))


def run(p: float, k: int, trials: int) -> dict:
    fake = NoisyUpstream(p_flip=p, seed=int(p * 1000) * 10 + k)
    with LoopbackServer(fake.app()) as upstream:
        runs = []
        started = time.perf_counter()
        for _ in range(2):   # two gateways that share nothing
            with gateway(upstream.url) as gw:
                runs.append(asyncio.run(cold_answers(gw.url, k, trials, f"p{p}-k{k}")))
        seconds = time.perf_counter() - started
    agree = sum(a == b for a, b in zip(*runs)) / trials
    usual = sum(a == "yes" for r in runs for a in r) / (2 * trials)
    q = p_elects_usual(p, k)
    return {"p": p, "k": k, "trials": trials, "agree": agree, "agree_expected": q * q + (1 - q) ** 2,
            "usual": usual, "usual_expected": q, "calls": len(fake.calls) / (2 * trials),
            "calls_expected": expected_calls(p, k), "seconds": round(seconds, 2)}


def table(rows: list[dict]) -> str:
    out = ["| p | k | two cold runs agree | expected | answer is the usual one | expected | upstream calls / answer | expected |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['p']} | {r['k']} | {r['agree']:.3f} | {r['agree_expected']:.3f} | {r['usual']:.3f} | "
                   f"{r['usual_expected']:.3f} | {r['calls']:.2f} | {r['calls_expected']:.2f} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400, help="distinct questions per (p, k), each asked cold twice")
    args = parser.parse_args()
    rows = [run(p, k, args.trials) for p in PS for k in KS]
    text = table(rows)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {platform.system()}, Python {platform.python_version()}"
    (RESULTS / "blackbox_vote.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    (RESULTS / "blackbox_vote.md").write_text(
        f"# Majority vote against a provider that flips its answer with probability p\n\n"
        f"`python3 bench/blackbox_vote.py --trials {args.trials}` on {machine}. Each question asked cold "
        f"through two gateways sharing nothing; k=1 is no vote (the baseline). Expected values are closed "
        f"form (bench/blackbox_vote.py).\n\n{text}\n")


if __name__ == "__main__":
    main()
