"""Prompt logprobs: `/v1/completions` with echo + logprobs (OpenAI's legacy shape) and vLLM's
`prompt_logprobs`, on the CPU path.

What holds here: every prompt token's logprob is the independent reference forward pass's
(to fp32 rounding); scoring is deterministic (scorings agree bit for bit, whichever shape
asks); and scoring a sampled completion again gives each completion token the logprob it
was sampled with to fp32 rounding only: the CPU's torch kernels sum a position computed in
a decode step (one row) and in a prefill chunk (many) differently. On the GPU the
batch-invariant kernels make that bit for bit, under load (bench/backend_gpu.py measures it).
"""
from __future__ import annotations

import aiohttp
import pytest
import torch

from conftest import Server, make_engine
from local_backend.tokenizer import Tokenizer
from reference import ReferenceModel

TEXT = "A paged cache holds keys and values in blocks of sixteen tokens. The quick brown fox"


async def post(url: str, body: dict) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json={"model": "qwen3", **body}) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def test_echo_logprobs_are_the_reference_model_s(qwen3, checkpoints):
    path = checkpoints["qwen3"]
    tok = Tokenizer(path)
    prompt = tok.encode(TEXT, add_special_tokens=True)
    ref = ReferenceModel(path).logits(prompt).log_softmax(-1)
    data = await post(qwen3.url, {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 0})
    choice = data["choices"][0]
    assert choice["text"] == tok.tok.decode(prompt, skip_special_tokens=False)
    assert choice["finish_reason"] == "length" and data["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["tokens"] == [tok.token_text(t) for t in prompt]
    # Named by id: ids past the tokenizer's words print alike.
    lp = (await post(qwen3.url, {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 0,
                                 "return_tokens_as_token_ids": True}))["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in prompt]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = [float(ref[i - 1, t]) for i, t in enumerate(prompt) if i]
    assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    for i, top in enumerate(lp["top_logprobs"][1:]):
        assert sorted(top.values(), reverse=True) == pytest.approx(torch.topk(ref[i], 2).values.tolist(), abs=1e-4)


async def test_vllm_prompt_logprobs_hold_the_prompt_token_with_its_rank(qwen3, checkpoints):
    prompt = Tokenizer(checkpoints["qwen3"]).encode(TEXT, add_special_tokens=True)
    ref = ReferenceModel(checkpoints["qwen3"]).logits(prompt).log_softmax(-1)
    data = await post(qwen3.url, {"prompt": prompt, "prompt_logprobs": 1, "max_tokens": 2, "temperature": 0})
    entries = data["choices"][0]["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None
    for i, entry in enumerate(entries[1:], 1):
        mine = entry[str(prompt[i])]
        assert mine["logprob"] == pytest.approx(float(ref[i - 1, prompt[i]]), abs=1e-4)
        assert mine["rank"] == 1 + int((ref[i - 1] > ref[i - 1, prompt[i]]).sum())
        assert any(v["rank"] == 1 for v in entry.values())
    assert data["choices"][0]["text"] and data["usage"]["completion_tokens"] == 2


async def test_scoring_a_sampled_completion_gives_its_sampled_logprobs(checkpoints):
    prompt = Tokenizer(checkpoints["qwen3"]).encode(TEXT, add_special_tokens=True)
    async with Server(make_engine(checkpoints["qwen3"]), "qwen3") as s:
        for params in ({"temperature": 0.9, "seed": 7}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 3}):
            sampled = (await post(s.url, {"prompt": prompt, "max_tokens": 24, "logprobs": 0, "ignore_eos": True,
                                          "return_tokens_as_token_ids": True, **params}))["choices"][0]["logprobs"]
            ids = [int(t.removeprefix("token_id:")) for t in sampled["tokens"]]
            scorings = []
            for body in ({"echo": True, "logprobs": 0}, {"prompt_logprobs": 0}, {"echo": True, "logprobs": 0}):
                choice = (await post(s.url, {"prompt": prompt + ids, "max_tokens": 0, **body}))["choices"][0]
                if "prompt_logprobs" in body:
                    scorings.append([e[str(t)]["logprob"] for e, t in
                                     zip(choice["prompt_logprobs"][len(prompt):], ids)])
                else:
                    scorings.append(choice["logprobs"]["token_logprobs"][len(prompt):])
            assert scorings[0] == scorings[1] == scorings[2]
            # The CPU's torch kernels are not batch-invariant: a position computed in a decode step
            # and in a prefill chunk agree to fp32 rounding only. On the GPU they agree bit for bit.
            assert scorings[0] == pytest.approx(sampled["token_logprobs"], abs=1e-4)


async def test_streamed_echo_leads_with_the_prompt(qwen3, checkpoints):
    prompt = Tokenizer(checkpoints["qwen3"]).encode(TEXT, add_special_tokens=True)
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "echo": True, "logprobs": 1}
    whole = (await post(qwen3.url, body))["choices"][0]
    chunks = await qwen3.client.completions.create(model="qwen3", stream=True, **body)
    texts, token_logprobs = [], []
    async for chunk in chunks:
        texts.append(chunk.choices[0].text)
        if chunk.choices[0].logprobs:
            token_logprobs += chunk.choices[0].logprobs.token_logprobs
    assert "".join(texts) == whole["text"]
    assert token_logprobs == whole["logprobs"]["token_logprobs"]


async def test_chat_prompt_logprobs_cover_the_rendered_template(qwen3):
    r = await qwen3.client.chat.completions.create(
        model="qwen3", messages=[{"role": "user", "content": TEXT}], max_tokens=2,
        extra_body={"prompt_logprobs": 0})
    entries = r.model_extra["prompt_logprobs"]
    assert len(entries) == r.usage.prompt_tokens and entries[0] is None
    assert all(len(e) == 1 and next(iter(e.values()))["rank"] >= 1 for e in entries[1:])
