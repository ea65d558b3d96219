"""Qwen3-MoE checkpoints: config.json's MoE fields in both layouts, the weights loaded and
fingerprinted, and greedy answers token for token against transformers' Qwen3-MoE, through the
torch references and (in a child process under the Triton interpreter) through kernels.moe."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import openai
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from conftest import ROOT, SPECIALS, Server, bpe_tokenizer, free_port, make_engine
from local_backend.config import ModelConfig
from local_backend.errors import CheckpointError
from local_backend.random_checkpoint import SHAPES, config_json, write_checkpoint
from test_triton_path import wait_ready

PROMPTS = ["A paged cache holds keys and values in blocks of sixteen tokens. The quick brown fox.",
           "Deterministic answers make caches honest."]
MAX_TOKENS = 12


def moe_checkpoint(path, layout="transformers5"):
    tok = bpe_tokenizer(SPECIALS["qwen3"], None)
    # init_std 0.3: a tiny model whose tokens and expert choices are far from ties.
    return write_checkpoint(path, SHAPES["qwen3-moe-tiny"], tok, init_std=0.3, dtype=torch.float32, layout=layout)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return moe_checkpoint(tmp_path_factory.mktemp("qwen3_moe"))


@pytest.fixture(scope="module")
def transformers_greedy(checkpoint):
    """Each prompt's ids and transformers' greedy continuation."""
    engine_tok = make_engine(checkpoint).tokenizer
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    out = []
    for text in PROMPTS:
        ids = engine_tok.encode(text, add_special_tokens=False)
        prompt = torch.tensor([ids])
        with torch.inference_mode():
            gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=MAX_TOKENS,
                                 do_sample=False, eos_token_id=None)
        out.append((ids, gen[0, len(ids):].tolist()))
        assert len(set(out[-1][1])) > 3, out[-1]   # a continuation that can tell models apart
    return out


@pytest.mark.parametrize("layout", ["transformers5", "transformers4"])
def test_moe_fields_parse_in_both_layouts(layout, tmp_path):
    shape = {**SHAPES["qwen3-moe-tiny"], "num_layers": 6}
    shape["moe"] = {**shape["moe"], "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": False}
    (tmp_path / "config.json").write_text(json.dumps(config_json(**shape, bos_token_id=0, eos_token_id=1,
                                                                 layout=layout)))
    cfg = ModelConfig.from_dir(tmp_path)
    assert cfg.arch == "qwen3_moe" and cfg.qk_norm
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.normalize) == (8, 2, 32, False)
    # transformers' rule: layers 1 and 5 route ((i + 1) % 2 == 0), layer 3 is listed as dense
    assert moe.sparse_layers == (False, True, False, False, False, True)


@pytest.mark.parametrize("field,value,message", [
    ("num_experts_per_tok", 9, "more than num_experts"),
    ("moe_intermediate_size", None, "missing field moe_intermediate_size"),
    ("decoder_sparse_step", 0, "decoder_sparse_step must be a positive int"),
    ("mlp_only_layers", "1", "mlp_only_layers must be a list"),
])
def test_bad_moe_fields_are_refused_by_name(field, value, message, tmp_path):
    cfg = config_json(**SHAPES["qwen3-moe-tiny"], bos_token_id=0, eos_token_id=1)
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_dir(tmp_path)


def test_a_missing_expert_is_named(checkpoint, tmp_path):
    moe_checkpoint(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.7.down_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.layers.2.mlp.experts.7.down_proj.weight"):
        make_engine(tmp_path)


def test_fused_expert_tensors_load_as_per_expert_ones(checkpoint, tmp_path):
    # transformers 5's module layout, [E, 2I, H] and [E, H, I] per layer: the same model.
    moe_checkpoint(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for layer in (0, 2):
        p = f"model.layers.{layer}.mlp.experts."
        n = SHAPES["qwen3-moe-tiny"]["moe"]["num_experts"]
        tensors[p + "gate_up_proj"] = torch.stack([torch.cat([tensors.pop(f"{p}{e}.gate_proj.weight"),
                                                              tensors.pop(f"{p}{e}.up_proj.weight")]) for e in range(n)])
        tensors[p + "down_proj"] = torch.stack([tensors.pop(f"{p}{e}.down_proj.weight") for e in range(n)])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    fused, split = make_engine(tmp_path), make_engine(checkpoint)
    for a, b in zip(fused.runner.model.w.layers, split.runner.model.w.layers):
        if a.experts is not None:
            assert torch.equal(a.experts.gate_up, b.experts.gate_up) and torch.equal(a.experts.down, b.experts.down)
    assert fused.fingerprint != split.fingerprint   # other tensors, other bytes


def test_the_fingerprint_covers_the_experts(checkpoint, tmp_path):
    moe_checkpoint(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.0.mlp.experts.3.up_proj.weight"][0, 0] += 1
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert make_engine(tmp_path).fingerprint != make_engine(checkpoint).fingerprint


@pytest.mark.parametrize("layout", ["transformers5", "transformers4"])
async def test_greedy_matches_transformers_token_for_token(layout, checkpoint, transformers_greedy, tmp_path):
    path = checkpoint if layout == "transformers5" else moe_checkpoint(tmp_path, layout)
    engine = make_engine(path)
    assert dataclasses.replace(engine.model_config, dtype=None) == dataclasses.replace(
        make_engine(checkpoint).model_config, dtype=None)
    async with Server(engine, "m") as s:
        for ids, expected in transformers_greedy:
            r = await s.client.completions.create(model="m", prompt=ids, max_tokens=MAX_TOKENS, temperature=0,
                                                  extra_body={"ignore_eos": True})
            assert r.choices[0].text == engine.tokenizer.decode(expected)


async def test_triton_experts_give_the_reference_tokens(checkpoint):
    """The engine with kernels.moe under the interpreter (a child process) and with the torch
    references: same greedy and seeded tokens, logprobs equal to float32 rounding."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_backend.cli", "--model", str(checkpoint), "--port", str(port),
         "--served-model-name", "m", "--device", "cpu", "--max-model-len", "256", "--chunk-size", "16",
         "--max-batched-tokens", "64"],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    params = dict(model="m", prompt=PROMPTS[0], max_tokens=5, temperature=0.8, seed=3, logprobs=2,
                  extra_body={"ignore_eos": True})
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        wait_ready(client, proc)
        triton_run = client.completions.create(**params).choices[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    async with Server(make_engine(checkpoint, chunk_size=16, max_batched_tokens=64), "m") as s:
        reference = (await s.client.completions.create(**params)).choices[0]
    assert triton_run.text == reference.text
    assert triton_run.logprobs.token_logprobs == pytest.approx(reference.logprobs.token_logprobs, abs=1e-4)
