"""Checkpoint loading, the fingerprint, and the `detgate backend` command line."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import openai
import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, SPECIALS, bpe_tokenizer, free_port, tiny_shape
from local_backend.config import ModelConfig
from local_backend.engine.llm_engine import fingerprint
from local_backend.loader import load_weights, read_tensors
from local_backend.random_checkpoint import write_checkpoint


def test_sharded_checkpoint_has_an_index_and_loads_like_one_file(checkpoints, tmp_path):
    llama = checkpoints["llama"]
    index = json.loads((llama / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    tok = bpe_tokenizer(SPECIALS["llama"], "<|begin_of_text|>")
    vocab = json.loads((llama / "config.json").read_text())["vocab_size"]
    single = write_checkpoint(tmp_path / "one", tiny_shape("llama", vocab), tok, seed=0, init_std=0.3,
                              bos="<|begin_of_text|>", eos="<|end|>")
    sharded, digest_sharded = read_tensors(llama, "cpu", torch.float32)
    whole, digest_whole = read_tensors(single, "cpu", torch.float32)
    assert digest_sharded == digest_whole
    assert sharded.keys() == whole.keys() and all(torch.equal(sharded[k], whole[k]) for k in whole)


def test_fused_weights_match_the_checkpoint(checkpoints):
    path = checkpoints["qwen2"]
    cfg = ModelConfig.from_dir(path)
    raw = load_file(str(path / "model.safetensors"))
    w, _ = load_weights(path, cfg, "cpu", torch.float32)
    layer = w.layers[1]
    p = "model.layers.1."
    q, k, v = (raw[p + f"self_attn.{n}_proj.weight"].float() for n in "qkv")
    assert torch.equal(layer.qkv, torch.cat([q, k, v]).t())
    assert torch.equal(layer.qkv_bias, torch.cat([raw[p + f"self_attn.{n}_proj.bias"].float() for n in "qkv"]))
    assert torch.equal(layer.down, raw[p + "mlp.down_proj.weight"].float().t())
    assert cfg.attention_bias and not cfg.qk_norm


def test_fingerprint_changes_with_every_input():
    tools = "torch 2.11.0, triton 3.6.0, cuda 13.0, ptxas 12.8"
    base = fingerprint("w1", "invariant", torch.bfloat16, "sm_90", tools)
    others = [fingerprint("w2", "invariant", torch.bfloat16, "sm_90", tools),
              fingerprint("w1", "standard", torch.bfloat16, "sm_90", tools),
              fingerprint("w1", "invariant", torch.float32, "sm_90", tools),
              fingerprint("w1", "invariant", torch.bfloat16, "cpu", tools),
              fingerprint("w1", "invariant", torch.bfloat16, "sm_90", tools.replace("triton 3.6.0", "triton 3.9.0"))]
    assert len({base, *others}) == 6 and base == fingerprint("w1", "invariant", torch.bfloat16, "sm_90", tools)


def test_unsupported_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(ValueError, match="unsupported architectures"):
        ModelConfig.from_dir(tmp_path)


def test_command_line_serves_a_checkpoint(checkpoints):
    port = free_port()
    code = "import sys; from local_backend.cli import main; main(sys.argv[1:])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--model", str(checkpoints["qwen3"]), "--port", str(port),
         "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "128"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
                time.sleep(0.2)
        assert [m.id for m in models.data] == ["tiny"]
        r = client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0)
        assert r.usage.completion_tokens <= 4 and r.system_fingerprint.startswith("fp_")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_command_line_rejects_a_bad_chunk_size(checkpoints):
    from local_backend.cli import main
    with pytest.raises(SystemExit):
        main(["--model", str(checkpoints["qwen3"]), "--device", "cpu", "--chunk-size", "100"])
