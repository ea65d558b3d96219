"""`detgate backend --model DIR ...`: load a checkpoint and serve it over HTTP."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from aiohttp import web

from local_backend.config import EngineConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="detgate backend", description=(
        "A single-GPU OpenAI-compatible server whose answers reproduce bit for bit under any load."))
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (Llama, Qwen2, Qwen3)")
    p.add_argument("--served-model-name", help="model name clients send (default: the directory's name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--mode", choices=["invariant", "standard"], default="invariant",
                   help="invariant: batch-invariant kernels; standard: vendor kernels (to measure the cost)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-batch", type=int, default=256, help="sequences per engine step (1 on the CPU)")
    p.add_argument("--kv-blocks", type=int, default=0, help="KV cache blocks (default: from free GPU memory)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    p.add_argument("--chunk-size", type=int, default=512, help="prefill chunk, a multiple of --block-size")
    p.add_argument("--max-batched-tokens", type=int, default=4096, help="tokens per engine step")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="prompt plus completion, in tokens (default: the checkpoint's max_position_embeddings)")
    p.add_argument("--chat-template", help="a jinja chat template file served in place of the checkpoint's "
                   "(one that renders `tools`, for a model whose own does not)")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.85)
    p.add_argument("--no-cuda-graphs", action="store_true", help="run decode steps eagerly")
    p.add_argument("--audit-rate", type=float, default=0.0,
                   help="fraction of finished requests re-run alone and cold when idle, to check determinism")
    return p


def main(argv: list[str]) -> None:
    p = parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    from local_backend.engine.client import EngineClient
    from local_backend.engine.engine_process import EngineProcess
    from local_backend.errors import CheckpointError
    from local_backend.metrics import Metrics
    from local_backend.server import make_app

    try:
        config = EngineConfig(
            model=args.model, device=args.device, mode=args.mode, max_batch=args.max_batch, kv_blocks=args.kv_blocks,
            block_size=args.block_size, chunk_size=args.chunk_size, max_batched_tokens=args.max_batched_tokens,
            max_model_len=args.max_model_len, cuda_graphs=not args.no_cuda_graphs,
            gpu_memory_fraction=args.gpu_memory_fraction, audit_rate=args.audit_rate,
            chat_template=args.chat_template)
    except ValueError as e:
        p.error(str(e))
    try:
        engine = EngineClient(EngineProcess(config, LOG_FORMAT), Metrics())
    except CheckpointError as e:   # names the file and the field: no traceback needed
        p.exit(2, f"detgate backend: cannot serve {args.model}: {e}\n")
    except RuntimeError as e:      # the engine process died loading; its traceback is in the log
        p.exit(1, f"detgate backend: cannot serve {args.model}: {e}\n")
    name = args.served_model_name or Path(args.model).resolve().name
    logging.getLogger(__name__).info("serving %s (%s, %s mode, %d KV blocks, fingerprint %s, engine process %d)",
                                     name, engine.info.device, args.mode, engine.info.num_blocks,
                                     engine.info.fingerprint, engine.link.pid)
    # A client that hangs up cancels its handler, which aborts its sequence in the engine:
    # an abandoned request stops taking a batch slot.
    web.run_app(make_app(engine, name), host=args.host, port=args.port, print=None, access_log=None,
                handler_cancellation=True)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
