"""What rendering each reader's own echoed fields (Surface.echoed: metadata, user, store, ...)
costs a cache hit, beside the same render with no echo (the bytes as stored) in the same
run: a Responses answer as a body and as a stream, for a reader whose values the stored
answer already shows and for one whose values differ. Every render gets a fresh copy of
the entry's bytes, as a hit read from the store does.

    python3 bench/echo_render.py [--hits 20000] [--words 200]
Writes bench/results/echo_render.json and .md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.apis.responses import SURFACE  # noqa: E402
from gateway.apis.surface import View  # noqa: E402
from gateway.cache.entry import Entry  # noqa: E402


def answer(words: int) -> bytes:
    text = " ".join(["word"] * words)
    return orjson.dumps({
        "id": "resp_" + "a" * 48, "object": "response", "created_at": 1, "status": "completed", "error": None,
        "incomplete_details": None, "model": "m-0001", "parallel_tool_calls": True, "store": True,
        "output": [{"id": "msg_" + "b" * 48, "type": "message", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]}],
        "usage": {"input_tokens": 11, "output_tokens": words, "total_tokens": 11 + words}, "user": None,
        "safety_identifier": None, "prompt_cache_key": None, "service_tier": "default", "metadata": {}})


def per_hit_us(entry: Entry, view: View, hits: int) -> float:
    """Median of 5 runs of `hits` renders, each of fresh bytes."""
    runs = []
    for _ in range(5):
        fresh = [Entry(bytes(entry.body), bytes(entry.stream), entry.model, entry.finish, bytes(entry.tail))
                 for _ in range(hits)]
        started = time.perf_counter()
        for one in fresh:
            SURFACE.render(one, view)
        runs.append((time.perf_counter() - started) / hits * 1e6)
    return statistics.median(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hits", type=int, default=20000)
    p.add_argument("--words", type=int, default=200)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "echo_render")
    args = p.parse_args()
    entry = SURFACE.from_body("bench", answer(args.words))
    rows = []
    for shape, stream in (("body", False), ("stream", True)):
        baseline = per_hit_us(entry, View(stream=stream), args.hits)
        for reader, sent in (("shows the stored values", {}), ("other metadata and user",
                                                               {"metadata": {"request_id": "r-1"}, "user": "u-1"})):
            echoed = per_hit_us(entry, SURFACE.view({**sent, "stream": stream}), args.hits)
            rows.append({"shape": shape, "reader": reader, "no_echo_us": round(baseline, 2),
                         "echo_us": round(echoed, 2), "added_us": round(echoed - baseline, 2)})
    header = ["shape", "reader", "no echo (us/hit)", "echo (us/hit)", "added (us/hit)"]
    lines = [f"# echoed fields on the hit path ({args.words}-word Responses answer, {args.hits} hits x 5, median)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [f"| {r['shape']} | {r['reader']} | {r['no_echo_us']} | {r['echo_us']} | {r['added_us']} |" for r in rows]
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
