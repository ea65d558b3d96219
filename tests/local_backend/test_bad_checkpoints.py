"""Checkpoints the backend cannot serve fail at start, with a message naming the file and the field."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import SPECIALS, bpe_tokenizer, make_engine, tiny_shape
from kernels.attention_triton import attention_layout_problem
from local_backend.cli import main
from local_backend.errors import CheckpointError
from local_backend.random_checkpoint import write_checkpoint


@pytest.fixture
def copy(checkpoints, tmp_path):
    """A fresh copy of one of the session's checkpoints, to break."""
    def make(arch):
        return shutil.copytree(checkpoints[arch], tmp_path / arch)
    return make


def edit_json(path, **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_missing_shard_names_the_index_and_the_file(copy):
    path = copy("llama")
    (path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors.index.json: weight_map names "
                                              "model-00002-of-00003.safetensors, missing from"):
        make_engine(path)


def test_missing_tensor_names_the_tensor_and_the_files(copy):
    path = copy("qwen2")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="tensor model.layers.1.mlp.up_proj.weight is in none of "
                                              "model.safetensors"):
        make_engine(path)


def test_unknown_architecture_names_the_field(copy):
    path = copy("qwen3")
    edit_json(path / "config.json", architectures=["MixtralForCausalLM"])
    with pytest.raises(CheckpointError, match=r"config.json: architectures \['MixtralForCausalLM'\] unsupported"):
        make_engine(path)


def test_vocab_and_embedding_sizes_must_agree(copy):
    path = copy("qwen3")
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    edit_json(path / "config.json", vocab_size=vocab + 64)
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor model.embed_tokens.weight is "
                                              rf"\[{vocab}, 64\], but config.json \(vocab_size, hidden_size\) "
                                              rf"makes it \[{vocab + 64}, 64\]"):
        make_engine(path)


def test_a_tokenizer_past_the_vocabulary_is_refused(copy):
    path = copy("qwen3")
    biggest = max(json.loads((path / "tokenizer.json").read_text())["model"]["vocab"].values())
    edit_json(path / "config.json", vocab_size=biggest)
    with pytest.raises(CheckpointError,
                       match=f"tokenizer.json: token id {biggest} is past config.json vocab_size {biggest}"):
        make_engine(path)


def test_untied_head_must_be_in_the_checkpoint(copy):
    path = copy("qwen3")   # written tied: no lm_head.weight
    edit_json(path / "config.json", tie_word_embeddings=False)
    with pytest.raises(CheckpointError, match="tie_word_embeddings is false, but lm_head.weight is in none of"):
        make_engine(path)


def test_a_template_that_does_not_compile_fails_at_start(copy):
    path = copy("qwen2")
    (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(CheckpointError, match=r"chat_template.jinja: the chat template does not compile \(line 1"):
        make_engine(path)


async def test_chat_without_a_template_names_the_field(copy):
    from conftest import Server
    path = copy("qwen3")
    edit_json(path / "tokenizer_config.json", chat_template=None)
    async with Server(make_engine(path), "qwen3") as s:
        r = await s.client.completions.create(model="qwen3", prompt="hello", max_tokens=2)
        assert r.usage.completion_tokens == 2
        with pytest.raises(Exception, match="no chat_template in tokenizer_config.json, no chat_template.jinja"):
            await s.client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "x"}])


def test_command_line_prints_the_reason_and_exits(copy, capsys):
    path = copy("qwen3")
    edit_json(path / "config.json", rope_parameters={"rope_type": "su", "rope_theta": 1e4})
    with pytest.raises(SystemExit) as e:
        main(["--model", str(path), "--device", "cpu"])
    assert e.value.code == 2
    assert "config.json: rope_parameters.rope_type 'su' is not implemented" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA fails to start")
def test_an_engine_that_dies_loading_ends_the_command_with_its_exit_code(tmp_path, capsys):
    """Not the checkpoint's fault (here: CUDA asked for where there is none): the engine
    process dies with its traceback in the log, and the server says so and exits 1."""
    tok = bpe_tokenizer(SPECIALS["qwen3"], None)
    path = write_checkpoint(tmp_path / "m", {**tiny_shape("qwen3", 384), "head_dim": 64}, tok, eos="<|im_end|>")
    with pytest.raises(SystemExit) as e:
        main(["--model", str(path), "--device", "cuda"])
    assert e.value.code == 1
    assert "the engine process exited with code 1 while loading" in capsys.readouterr().err


@pytest.mark.parametrize("heads, kv_heads, head_dim, problem", [
    (9, 3, 64, None), (15, 5, 64, None), (35, 5, 128, None), (28, 4, 128, None), (32, 32, 128, None),
    (64, 1, 128, None), (65, 1, 64, "65 query heads per KV head"), (12, 4, 96, "head_dim 96"),
    (10, 4, 64, "not a multiple")])
def test_head_layouts_the_gpu_kernels_run(heads, kv_heads, head_dim, problem):
    got = attention_layout_problem(heads, kv_heads, head_dim)
    assert got is None if problem is None else problem in got


def test_any_gqa_group_decodes_like_the_reference_on_the_cpu(tmp_path):
    from reference import ReferenceModel
    tok = bpe_tokenizer(SPECIALS["qwen2"], None)
    shape = {**tiny_shape("qwen2", 384), "num_heads": 6, "num_kv_heads": 2, "hidden_size": 96}   # group 3
    path = write_checkpoint(tmp_path / "g3", shape, tok, init_std=0.3, seed=5)
    engine = make_engine(path)
    prompt = engine.tokenizer.encode("The quick brown fox jumps", add_special_tokens=True)
    expected, _ = ReferenceModel(path).greedy(prompt, 8)
    assert engine.greedy(prompt, 8) == expected


@pytest.mark.parametrize("arch, fields, message", [
    ("llama", {"mlp_bias": True}, "mlp_bias: True is not implemented"),
    ("llama", {"attention_bias": True}, "attention_bias: True is not implemented"),
    ("qwen3", {"hidden_act": "gelu_pytorch_tanh"}, "hidden_act: 'gelu_pytorch_tanh' is not implemented"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64}, "use_sliding_window: true is not implemented"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types: .* is not implemented"),
    ("qwen3", {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
     "quantization_config: quantized checkpoints"),
    ("llama", {"logit_softcapping": 30.0}, "logit_softcapping: unknown to this engine"),
])
def test_config_fields_the_engine_does_not_implement_are_refused_by_name(copy, arch, fields, message):
    path = copy(arch)
    edit_json(path / "config.json", **fields)
    with pytest.raises(CheckpointError, match=message) as e:
        make_engine(path)
    assert str(path / "config.json") in str(e.value)


def test_fields_at_the_values_the_engine_implements_pass(copy):
    path = copy("qwen2")
    edit_json(path / "config.json", use_sliding_window=False, sliding_window=4096, max_window_layers=1,
              layer_types=["full_attention", "full_attention"], hidden_act="silu", initializer_range=0.02)
    assert make_engine(path).model_config.arch == "qwen2"


def test_a_tensor_the_engine_would_not_use_is_refused(copy):
    """A bias an engine without it never reads, an fp8 scale, a layer past num_hidden_layers."""
    path = copy("qwen3")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.bias"] = torch.zeros(64)
    tensors["model.layers.0.mlp.down_proj.weight_scale_inv"] = torch.ones(1)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"2 tensor\(s\) this engine does not implement: "
                                              r"model.layers.0.mlp.down_proj.bias \(model.safetensors\)"):
        make_engine(path)


def test_rope_inverse_frequencies_of_old_checkpoints_are_derived_and_pass(copy):
    path = copy("qwen3")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, str(path / "model.safetensors"))
    make_engine(path)


def test_a_truncated_safetensors_file_is_named(copy):
    path = copy("qwen2")
    file = path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a readable safetensors file") as e:
        make_engine(path)
    assert str(file) in str(e.value)


def test_the_served_context_defaults_to_the_checkpoints_and_more_is_refused(copy):
    path = copy("qwen3")
    edit_json(path / "config.json", max_position_embeddings=512)
    assert make_engine(path, max_model_len=None).max_model_len == 512
    with pytest.raises(CheckpointError, match="max_position_embeddings is 512, less than the --max-model-len 1024"):
        make_engine(path, max_model_len=1024)
