"""The engine through the Triton kernels (under the interpreter on the CPU) computes what it
computes through the torch references: same tokens, logprobs equal to float32 rounding.
This pins the engine's side of the kernel contract (weight layouts, packed q/k/v views,
paged-KV metadata over chunked prefill and decode) before a GPU ever sees it. The
interpreter must be on before triton.jit defines the kernels, so that server runs in a
child process started with TRITON_INTERPRET=1."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import openai
import pytest

from conftest import ROOT, Server, free_port, make_engine

PROMPT = "A paged cache holds keys and values in blocks of sixteen tokens. The quick brown fox."
ARGS = ["--device", "cpu", "--max-model-len", "256", "--chunk-size", "16", "--max-batched-tokens", "64"]


def wait_ready(client: openai.OpenAI, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
            time.sleep(0.2)


def complete(client) -> tuple:
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=5, temperature=0.8, seed=3, logprobs=2,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text, r.choices[0].logprobs.token_logprobs, r.usage.prompt_tokens


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
async def test_triton_kernels_and_references_agree_through_the_engine(checkpoints, arch):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_backend.cli", "--model", str(checkpoints[arch]), "--port", str(port),
         "--served-model-name", "m", *ARGS],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        wait_ready(client, proc)
        text, logprobs, prompt_tokens = complete(client)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    engine = make_engine(checkpoints[arch], chunk_size=16, max_batched_tokens=64)
    async with Server(engine, "m") as s:
        r = await s.client.completions.create(model="m", prompt=PROMPT, max_tokens=5, temperature=0.8, seed=3,
                                              logprobs=2, extra_body={"ignore_eos": True})
    assert prompt_tokens > 16          # the prompt is prefilled in several chunks
    assert text == r.choices[0].text
    assert logprobs == pytest.approx(r.choices[0].logprobs.token_logprobs, abs=1e-4)
