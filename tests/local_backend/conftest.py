"""Tiny random-weight checkpoints of each architecture, engines over them, and a live server.

Each checkpoint is real: safetensors (the Llama one sharded in three with an index),
config.json, a byte-level BPE tokenizer trained here on a few sentences, and a chat
template. Engines are built once per session; each test gets its own server on a
loopback port, driven by the official openai client.
"""
from __future__ import annotations

from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from fakes.loopback import free_port
from local_backend.config import EngineConfig
from local_backend.engine.client import EngineClient
from local_backend.engine.engine_process import EngineProcess
from local_backend.engine.engine_thread import EngineThread
from local_backend.engine.llm_engine import Engine
from local_backend.metrics import Metrics
from local_backend.random_checkpoint import CHATML, write_checkpoint
from local_backend.server import make_app

ROOT = Path(__file__).resolve().parents[2]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Deterministic answers make caches honest and tests reproducible.",
    "A paged cache holds keys and values in blocks of sixteen tokens.",
    "Café, naïve, jalapeño: accents are bytes too. 😀 emoji span several bytes. 日本語も。",
    "user assistant system: hello there, how are you today?",
]

LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<|start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")

SPECIALS = {
    "llama": ["<|begin_of_text|>", "<|start|>", "<|end|>"],
    "qwen2": ["<|im_start|>", "<|im_end|>"],
    "qwen3": ["<|im_start|>", "<|im_end|>"],
}


def bpe_tokenizer(specials: list[str], bos: str | None) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def tiny_shape(arch: str, vocab_size: int) -> dict:
    return dict(arch=arch, vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=4, num_kv_heads=2, head_dim=16, tie=arch == "qwen3", rope_theta=10000.0)


@pytest.fixture(autouse=True)
def reference_kernels(monkeypatch):
    """The CPU backend runs the plain-torch reference kernels. tests/kernels turns the Triton
    interpreter on for the whole process (kernels read it per call), which would make every
    forward pass here crawl through interpreted Triton, so it is off for these tests."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict:
    out = {}
    for seed, arch in enumerate(("llama", "qwen2", "qwen3")):
        llama = arch == "llama"
        tok = bpe_tokenizer(SPECIALS[arch], "<|begin_of_text|>" if llama else None)
        vocab = -(-tok.get_vocab_size() // 64) * 64   # padded past the tokenizer, as real models are
        out[arch] = write_checkpoint(
            tmp_path_factory.mktemp(arch), tiny_shape(arch, vocab), tok, seed=seed,
            chat_template=LLAMA_TEMPLATE if llama else CHATML,
            bos="<|begin_of_text|>" if llama else None, eos="<|end|>" if llama else "<|im_end|>",
            shards=3 if llama else 1, init_std=0.3)
    return out


def make_engine(path, **overrides) -> Engine:
    config = EngineConfig(model=str(path), device="cpu", **{"max_model_len": 256, **overrides})
    return Engine(config)


@pytest.fixture(scope="session")
def engines(checkpoints) -> dict:
    return {arch: make_engine(path) for arch, path in checkpoints.items()}


async def metric(url: str, name: str) -> float:
    """One sample's value from the server's /metrics."""
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics") as r:
            text = await r.text()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


class Server:
    """A server over an engine on a thread of this process, which tests reach into, or over an
    EngineProcess, as the CLI runs it."""

    def __init__(self, engine: Engine | EngineProcess, name: str):
        self.engine, self.name = engine, name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        client = EngineClient(EngineThread(engine) if isinstance(engine, Engine) else engine, Metrics())
        self.runner = web.AppRunner(make_app(client, name), handler_cancellation=True)   # as the CLI runs it

    async def __aenter__(self):
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.client = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)
        return self

    async def __aexit__(self, *exc):
        await self.client.close()
        await self.runner.cleanup()


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
async def server(request, engines):
    async with Server(engines[request.param], request.param) as s:
        yield s


@pytest.fixture
async def qwen3(engines):
    async with Server(engines["qwen3"], "qwen3") as s:
        yield s
