"""Checkpoint loading, the fingerprint, and the `detgate backend` command line."""
from __future__ import annotations

import json
import os
import signal
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
    sharded, digest_sharded, _ = read_tensors(llama, "cpu", torch.float32)
    whole, digest_whole, _ = read_tensors(single, "cpu", torch.float32)
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
    args = ("w1", "s1", "invariant", torch.bfloat16, "sm_90", tools, 512)
    changed = ["w2", "s2", "standard", torch.float32, "cpu", tools.replace("triton 3.6.0", "triton 3.9.0"), 64]
    others = [fingerprint(*args[:i], value, *args[i + 1:]) for i, value in enumerate(changed)]
    assert len({fingerprint(*args), *others}) == 8 and fingerprint(*args) == fingerprint(*args)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_command_line_serves_a_checkpoint_and_stops_cleanly(checkpoints, stop):
    """Served by its engine process; SIGTERM to the server, or Ctrl-C to the terminal's whole
    process group, engine included, ends both without a traceback."""
    port = free_port()
    code = "import sys; from local_backend.cli import main; main(sys.argv[1:])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--model", str(checkpoints["qwen3"]), "--port", str(port),
         "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "128"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
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
        os.killpg(proc.pid, stop) if stop == signal.SIGINT else proc.send_signal(stop)
        assert proc.wait(timeout=30) == 0
        output = proc.stdout.read().decode()
        assert "Traceback" not in output and "engine process" in output, output
        assert wait_until(lambda: not group_alive(proc.pid), 10), "the engine process outlived the server"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_command_line_rejects_a_bad_chunk_size(checkpoints):
    from local_backend.cli import main
    with pytest.raises(SystemExit):
        main(["--model", str(checkpoints["qwen3"]), "--device", "cpu", "--chunk-size", "100"])
