"""config.json as transformers 5 and 4 write it, RoPE types against transformers' own
frequencies, generation_config.json defaults, and what the fingerprint covers."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from conftest import SPECIALS, bpe_tokenizer, make_engine, tiny_shape
from local_backend.config import ModelConfig
from local_backend.errors import CheckpointError
from local_backend.models.rope_frequencies import inv_freq
from local_backend.random_checkpoint import config_json, write_checkpoint

ROPE_TYPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    "yarn, mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.707},
    "yarn, attention_factor": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.25, "truncate": False},
}
SHAPE = dict(arch="llama", vocab_size=64, hidden_size=256, intermediate_size=64, num_layers=1, num_heads=2,
             num_kv_heads=1, head_dim=128, tie=True, rope_theta=500000.0)


def checkpoint_config(tmp_path, cfg: dict) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return ModelConfig.from_dir(tmp_path)


@pytest.mark.parametrize("name", ROPE_TYPES)
@pytest.mark.parametrize("layout", ["transformers5", "transformers4"])
def test_rope_matches_transformers(name, layout, tmp_path):
    scaling = ROPE_TYPES[name]
    cfg = config_json(**SHAPE, bos_token_id=0, eos_token_id=1, rope_scaling=scaling, layout=layout)
    ours = checkpoint_config(tmp_path, cfg).rope
    assert ours.kind == (scaling or {}).get("rope_type", "default") and ours.theta == 500000.0
    theirs = LlamaRotaryEmbedding(LlamaConfig(**cfg))   # transformers reads either layout too
    # transformers computes the frequencies in fp32, the backend in fp64
    assert torch.allclose(inv_freq(ours, 128), theirs.inv_freq.double(), rtol=1e-6, atol=0)
    assert ours.attention_factor == pytest.approx(theirs.attention_scaling, rel=1e-6)


def test_qwen2_old_layout_rope_scaling_with_type_key(tmp_path):
    cfg = config_json(**{**SHAPE, "arch": "qwen2"}, bos_token_id=0, eos_token_id=1, layout="transformers4")
    cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    ours = checkpoint_config(tmp_path, cfg).rope
    theirs = Qwen2RotaryEmbedding(Qwen2Config(**cfg))
    assert ours.kind == "yarn"
    assert torch.allclose(inv_freq(ours, 128), theirs.inv_freq.double(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("rope, message", [
    ({"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0], "long_factor": [2.0]},
     "rope_parameters.rope_type 'longrope' is not implemented"),
    ({"rope_type": "linear", "rope_theta": 1e4}, "rope_parameters of rope_type 'linear' lacks factor"),
    ({"full_attention": {"rope_type": "default", "rope_theta": 1e4}}, "RoPE per layer type"),
    ({"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unimplemented_rope_is_refused_naming_the_field(rope, message, tmp_path):
    cfg = config_json(**SHAPE, bos_token_id=0, eos_token_id=1)
    cfg["rope_parameters"] = rope
    with pytest.raises(CheckpointError, match=message) as e:
        checkpoint_config(tmp_path, cfg)
    assert str(tmp_path / "config.json") in str(e.value)


def test_dtype_and_torch_dtype_are_both_read(tmp_path):
    new = config_json(**SHAPE, bos_token_id=0, eos_token_id=1, layout="transformers5")
    old = config_json(**SHAPE, bos_token_id=0, eos_token_id=1, layout="transformers4")
    assert "torch_dtype" not in new and "dtype" not in old
    assert checkpoint_config(tmp_path, new).dtype == checkpoint_config(tmp_path, old).dtype == "bfloat16"
    with pytest.raises(CheckpointError, match="dtype 'float8' is not one of"):
        checkpoint_config(tmp_path, {**new, "dtype": "float8"})


def test_both_layouts_decode_alike_and_the_fingerprint_covers_config_and_chunk_size(tmp_path):
    tok = bpe_tokenizer(SPECIALS["qwen3"], None)
    shape = tiny_shape("qwen3", 384)
    paths = {layout: write_checkpoint(tmp_path / layout, {**shape, "rope_theta": 1e5}, tok, layout=layout,
                                      seed=3, init_std=0.3) for layout in ("transformers5", "transformers4")}
    engines = {layout: make_engine(path) for layout, path in paths.items()}
    assert engines["transformers5"].model_config.rope == engines["transformers4"].model_config.rope
    cos = [e.runner.model.cos for e in engines.values()]
    assert torch.equal(*cos)
    # Same weights, other config bytes: another fingerprint, as for any change of config.json.
    assert engines["transformers5"].fingerprint != engines["transformers4"].fingerprint
    assert make_engine(paths["transformers5"], chunk_size=64).fingerprint != engines["transformers5"].fingerprint
    assert make_engine(paths["transformers5"]).fingerprint == engines["transformers5"].fingerprint
    (paths["transformers5"] / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    assert make_engine(paths["transformers5"]).fingerprint != engines["transformers5"].fingerprint


def test_generation_config_eos_list_and_defaults(tmp_path):
    cfg = config_json(**SHAPE, bos_token_id=0, eos_token_id=1)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [1, 7], "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    got = checkpoint_config(tmp_path, cfg)
    assert got.eos_token_ids == (1, 7)
    assert dict(got.generation.defaults) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert dict(checkpoint_config(tmp_path, cfg).generation.defaults) == {"temperature": 0.0}
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 1.5}))
    with pytest.raises(CheckpointError, match="generation_config.json: top_p must be a number in"):
        checkpoint_config(tmp_path, cfg)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 64]}))
    with pytest.raises(CheckpointError, match="eos_token_id .* past config.json's vocab_size 64"):
        checkpoint_config(tmp_path, cfg)
