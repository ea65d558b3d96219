"""The engine's own host work in a decode step, without the model or HTTP: what is left of a
step's host share once the GPU's time and the HTTP handlers' are taken out.

    python3 bench/backend_host_step.py [--batch 256] [--steps 300] [--out bench/results]

Runs on the CPU. A tiny random checkpoint gives the runner its buffers; `--batch` sequences
of 128 prompt tokens are admitted and prefilled on paper (no forward), then each decode step
does what the engine does around the GPU's work: the scheduler's pick and block growth,
staging the inputs (`ModelRunner._stage`), the scheduler's bookkeeping after the step (block
hashes where a block fills), turning the sampled ids into Samples appended to their
sequences, and the step's lot: an Event per sequence, pickled as the engine process's pipe
pickles it. Not counted: the finish checks, the outbox's wait for the HTTP side, the graph
launches and the GPU waits. Medians and means of --steps steps, us.
Writes backend_host_step.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from local_backend.config import ModelConfig  # noqa: E402
from local_backend.engine.block_manager import BlockManager  # noqa: E402
from local_backend.engine.messages import Event, Lot  # noqa: E402
from local_backend.engine.model_runner import ModelRunner  # noqa: E402
from local_backend.engine.scheduler import Scheduler  # noqa: E402
from local_backend.engine.sequence import Sequence  # noqa: E402
from local_backend.loader import load_weights  # noqa: E402
from local_backend.models.llama import Llama  # noqa: E402
from local_backend.random_checkpoint import numbered_tokenizer, write_checkpoint  # noqa: E402
from local_backend.sampling_params import SamplingParams  # noqa: E402
from md_table import markdown_table  # noqa: E402  (this script's folder is on sys.path)

TINY = dict(arch="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
            num_kv_heads=1, head_dim=32, tie=True, rope_theta=1e6)
PHASES = ("schedule", "stage", "advance and register", "samples", "lot")


def runner_and_scheduler(path: Path, batch: int) -> tuple[ModelRunner, Scheduler]:
    cfg = ModelConfig.from_dir(str(path))
    weights, _ = load_weights(str(path), cfg, "cpu", torch.float32)
    blocks = 16 * batch * 4
    runner = ModelRunner(Llama(cfg, weights, 4096), blocks, 16, 4096, batch, 8192, 512, use_cuda_graphs=False)
    return runner, Scheduler(BlockManager(blocks, 16), batch, 8192, 512)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp) / "tiny", TINY, numbered_tokenizer(1024, ["<|endoftext|>", "<|im_end|>"]))
        runner, scheduler = runner_and_scheduler(path, args.batch)
    rng = random.Random(0)
    for i in range(args.batch):
        params = SamplingParams(seed=i, max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
        scheduler.add(Sequence(i, [rng.randrange(1000) for _ in range(128)], 128, params))
    prefill = scheduler.schedule()
    scheduler.advance(prefill)
    for item in prefill:
        item.seq.token_ids.append(1)
    us: dict[str, list[float]] = {phase: [] for phase in PHASES}
    tokens = runner.slots[0][0]["tokens"]
    for _ in range(args.steps):
        t0 = time.perf_counter()
        scheduled = scheduler.schedule()
        t1 = time.perf_counter()
        staged = runner._stage(scheduled)
        t2 = time.perf_counter()
        scheduler.advance(scheduled)
        scheduler.register(scheduled)
        t3 = time.perf_counter()
        samples = runner._samples(staged, [tokens[:len(staged.sampled)]])
        for seq, sample in zip(staged.sampled, samples):
            seq.token_ids.append(sample.token)
        t4 = time.perf_counter()
        lot = Lot([(seq.seq_id, Event(sample)) for seq, sample in zip(staged.sampled, samples)])
        ForkingPickler.dumps(lot)   # as the engine process's pipe pickles it
        t5 = time.perf_counter()
        for phase, a, b in zip(PHASES, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
            us[phase].append((b - a) * 1e6)
    rows = [{"phase": phase, "median_us": round(statistics.median(v), 1), "mean_us": round(statistics.fmean(v), 1)}
            for phase, v in us.items()]
    rows.append({"phase": "total", "median_us": round(sum(r["median_us"] for r in rows), 1),
                 "mean_us": round(sum(r["mean_us"] for r in rows), 1)})
    table = markdown_table(rows, ["phase", "median_us", "mean_us"])
    env = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
           "torch": torch.__version__, "batch": args.batch, "steps": args.steps}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "backend_host_step.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    (out / "backend_host_step.md").write_text(
        f"# The engine's host work in a decode step, {args.batch} sequences, no model, no HTTP\n\n"
        f"`python3 bench/backend_host_step.py --batch {args.batch} --steps {args.steps}` (Python "
        f"{env['python']}, torch {env['torch']}). us per step.\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
