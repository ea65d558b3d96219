"""Constrained decoding's cost and invariance on the GPU: a JSON schema's grammar (llguidance)
masking each row's logits, beside free decoding, in the same engine and run.

    python3 bench/backend_structured.py --tokenizer .cache/smollm2/SmolLM2-135M-Instruct/tokenizer.json

A random checkpoint of Qwen3-0.6B's shape (28 layers) over a real byte-level BPE tokenizer
(SmolLM2's, 49152 tokens: the mask's width and the grammar's work depend on a real vocabulary),
driven in-process (no HTTP). Three parts:
  * compile: milliseconds to compile a grammar the first time (a schema, json_object, a
    two-tool call grammar) and to find it in the cache after;
  * cost: the median decode step, batches of 1, 32 and 256 sequences, all free (seeded,
    temperature 1) or all constrained to one schema (an array of 300 integers, so that no
    row finishes inside the measured steps); a constrained step is not staged ahead of the
    one before (its mask needs that step's token) and its sampler is not a CUDA graph;
  * invariance: constrained rows (greedy and seeded) give the same tokens and logprob bits
    alone as in batches of 32 and 256 that mix constrained and free rows, free rows the same
    beside constrained ones, and 8 identical constrained requests in one batch one answer.
Writes backend_structured_h200.{json,md} (the device name's last word, lower-cased).
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from local_backend import grammar, tool_calls  # noqa: E402
from local_backend.config import EngineConfig  # noqa: E402
from local_backend.engine.llm_engine import Engine  # noqa: E402
from local_backend.random_checkpoint import SHAPES, write_checkpoint  # noqa: E402
from local_backend.sampling_params import SamplingParams  # noqa: E402
from md_table import markdown_table  # noqa: E402  (this script's folder is on sys.path)

LONG = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 300}
SHORT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                   "maxItems": 4}},
         "required": ["name", "tags"], "additionalProperties": False}
# Tools as protocol.Tool reads them (attributes), without the HTTP side's pydantic.
TOOLS = [SimpleNamespace(function=SimpleNamespace(name=n, strict=True, parameters={
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]})) for n in ("weather", "forecast")]


class Driver:
    """The engine stepped on this thread; each request's tokens and logprobs collected."""

    def __init__(self, engine: Engine):
        self.engine, self.ids, self.out = engine, itertools.count(), {}
        engine.outbox.connect(self._deliver)

    def _deliver(self, lot) -> None:
        for rid, event in lot.events:
            if event.sample is not None:
                self.out.setdefault(rid, []).append((event.sample.token, event.sample.logprob))
        self.engine.outbox.was_read()

    def run(self, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[list, list[float]]:
        """Every request's [(token, logprob)], and the wall time of each step once all decode."""
        e = self.engine
        rids = []
        for prompt, p in zip(prompts, params):
            rid = next(self.ids)
            e._command(("add", rid, prompt, p))
            rids.append(rid)
        seqs = [e._requests[r] for r in rids]
        steps = []
        while e.scheduler.has_work() or e._in_flight:
            decoding = all(s.num_generated > 0 for s in seqs)
            start = time.perf_counter()
            e._step()
            if decoding and e._in_flight is not None:
                steps.append(time.perf_counter() - start)
        e.outbox.send()
        return [self.out.pop(r, []) for r in rids], steps


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_engine(tokenizer: Path, work: Path, layers: int, device: str) -> Engine:
    tok = Tokenizer.from_file(str(tokenizer))
    shape = {**SHAPES["qwen3-0.6b"], "vocab_size": -(-tok.get_vocab_size() // 64) * 64, "num_layers": layers}
    path = write_checkpoint(work / "qwen3", shape, tok, eos="<|im_end|>", device=device, init_std=0.02, seed=1)
    return Engine(EngineConfig(model=str(path), device=device, max_batch=256, max_model_len=1024))


def compile_times(engine: Engine) -> list[dict]:
    fresh = grammar.Grammars(engine.tokenizer.tok.to_str(), engine.model_config.vocab_size,
                             sorted(engine.eos_token_ids))
    rows = []
    for name, g in (("json_schema (object, 2 fields)", grammar.json_schema(SHORT)),
                    ("json_schema (array of 300 ints)", grammar.json_schema(LONG)),
                    ("json_object", grammar.json_object()),
                    ("tool calls (hermes, 2 tools)", tool_calls.call_grammar("hermes", TOOLS, True))):
        start = time.perf_counter()
        fresh.compiled(g)
        first = time.perf_counter() - start
        start = time.perf_counter()
        fresh.matcher(g)
        again = time.perf_counter() - start
        rows.append({"grammar": name, "first compile, ms": round(first * 1e3, 2),
                     "cached, per sequence (copy), ms": round(again * 1e3, 3)})
    return rows


def prompt(i: int, vocab: int) -> list[int]:
    return [(i * 7919 + j * 104729) % (vocab - 64) + 32 for j in range(32)]


def cost(driver: Driver, vocab: int, long_grammar: str, tokens: int, batches: list[int]) -> list[dict]:
    rows = []
    for batch in batches:
        prompts = [prompt(i, vocab) for i in range(batch)]
        medians = {}
        for kind in ("free", "constrained", "free", "constrained"):   # in turns; the second of each is kept
            params = [SamplingParams(seed=i, max_tokens=tokens, temperature=1.0, ignore_eos=True,
                                     grammar=long_grammar if kind == "constrained" else None) for i in range(batch)]
            _, steps = driver.run(prompts, params)
            medians[kind] = statistics.median(steps) * 1e3
            log(f"batch {batch} {kind}: {len(steps)} steps, median {medians[kind]:.3f} ms")
        rows.append({"batch": batch, "free step, ms": round(medians["free"], 3),
                     "constrained step, ms": round(medians["constrained"], 3),
                     "constrained / free": round(medians["constrained"] / medians["free"], 2)})
    return rows


def invariance(driver: Driver, vocab: int, short_grammar: str, batches: list[int]) -> list[dict]:
    targets = [SamplingParams(seed=s, max_tokens=48, temperature=t, top_p=p, logprobs=0, grammar=short_grammar)
               for s, t, p in ((0, 0.0, 1.0), (7, 1.0, 1.0), (9, 0.8, 0.9), (11, 1.3, 1.0))]
    free = [SamplingParams(seed=100 + i, max_tokens=40, temperature=0.9, logprobs=0) for i in range(2)]
    mine = targets + free
    prompts = [prompt(i, vocab) for i in range(len(mine))]
    alone = [driver.run([p], [x])[0][0] for p, x in zip(prompts, mine)]
    log(f"alone: {[len(a) for a in alone]} tokens")
    rows = []
    for batch in batches:
        others = batch - len(mine)
        crowd = [SamplingParams(seed=1000 + i, max_tokens=20 + i % 30, temperature=1.0, logprobs=0,
                                grammar=short_grammar if i % 2 else None) for i in range(others)]
        order = list(range(batch))
        order = order[len(mine):] + order[:len(mine)]   # the rows under test at the batch's end
        all_params = mine + crowd
        all_prompts = prompts + [prompt(50 + i, vocab) for i in range(others)]
        got, _ = driver.run([all_prompts[i] for i in order], [all_params[i] for i in order])
        by_index = {i: got[k] for k, i in enumerate(order)}
        same = [by_index[i] == alone[i] for i in range(len(mine))]
        log(f"batch {batch}: {sum(same)} of {len(same)} equal")
        rows.append({"check": f"{len(targets)} constrained + {len(free)} free rows alone vs in a batch of {batch} "
                              f"({others // 2} more constrained)",
                     "equal (tokens and logprob bits)": f"{sum(same)} of {len(same)}"})
    crowd = max(batches, default=8) - 8
    copies, _ = driver.run([prompts[1]] * 8 + [prompt(70 + i, vocab) for i in range(crowd)],
                           [targets[1]] * 8 + [SamplingParams(seed=i, max_tokens=30, temperature=1.0)
                                               for i in range(crowd)])
    unique = len({json.dumps(c) for c in copies[:8]})
    log(f"copies: {unique} unique")
    rows.append({"check": f"8 identical seeded constrained requests among {crowd} free",
                 "equal (tokens and logprob bits)": f"{unique} unique of 8"})
    text = driver.engine.tokenizer.decode([t for t, _ in alone[1]])
    rows.append({"check": "a constrained answer parses against its schema", "equal (tokens and logprob bits)":
                 str(_valid(text))})
    return rows


def _valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return set(value) == {"name", "tags"} and len(value["name"]) <= 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path,
                        default=ROOT / ".cache" / "smollm2" / "SmolLM2-135M-Instruct" / "tokenizer.json")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sequence in the cost runs")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--layers", type=int, default=28, help="fewer for a quick try (the shape is Qwen3-0.6B's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        engine = make_engine(args.tokenizer, Path(work), args.layers, args.device)
        setup_s = time.perf_counter() - start
    log(f"engine ready in {setup_s:.1f} s")
    vocab = engine.model_config.vocab_size
    driver = Driver(engine)
    compiles = compile_times(engine)
    log(f"compile times: {compiles}")
    long_grammar, short_grammar = grammar.json_schema(LONG), grammar.json_schema(SHORT)
    costs = cost(driver, vocab, long_grammar, args.tokens, args.batches)
    log(f"cost: {costs}")
    checks = invariance(driver, vocab, short_grammar, [b for b in args.batches if b > 8])
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    env = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
           "engine setup s": round(setup_s, 1), "vocab": vocab, "tokens per sequence": args.tokens}
    name = "backend_structured_" + device.split()[-1].lower()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({"env": env, "compile": compiles, "cost": costs,
                                                       "invariance": checks}, indent=1))
    md = "\n\n".join([
        f"# Constrained decoding on {device}\n\n`python3 bench/backend_structured.py --layers {args.layers} --batches "
        f"{' '.join(map(str, args.batches))} --tokens {args.tokens}` (torch {torch.__version__}; a random "
        f"Qwen3-0.6B-shaped checkpoint of {args.layers} layers over SmolLM2's {vocab}-token BPE; invariant mode, "
        f"CUDA graphs; engine set up in {setup_s:.0f} s).",
        "## Grammar compile time (llguidance; once per schema, then cached)\n\n" + markdown_table(compiles),
        f"## Decode step, free vs constrained (median of the steps once every row decodes, {args.tokens} "
        "tokens a sequence)\n\n" + markdown_table(costs),
        "## Invariance of constrained rows\n\n" + markdown_table(checks)])
    (args.out / f"{name}.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
