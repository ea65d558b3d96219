"""Write random-weight Hugging Face checkpoints (Llama, Qwen2, Qwen3, Qwen3-MoE) for tests and benchmarks.

The directory is a real checkpoint: config.json (as transformers 5 writes it, with
`rope_parameters` and `dtype`, or in the earlier layout with a top-level `rope_theta` and
`torch_dtype`), safetensors (sharded with an index when asked), tokenizer.json and
tokenizer_config.json with a chat template, and generation_config.json when given;
transformers loads it too, which is how the benchmarks compare against `generate`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "qwen3_moe": "Qwen3MoeForCausalLM"}

# Per-layer shapes of the real models; `layers` may be lowered to save time and memory.
SHAPES = {
    "qwen3-0.6b": dict(arch="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, tie=True, rope_theta=1e6),
    "llama3-8b": dict(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, tie=False, rope_theta=5e5),
    # 48 layers, all sparse: 128 experts of 768, 8 routed per token (3.3B of 30.5B parameters active).
    "qwen3-30b-a3b": dict(arch="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, tie=False, rope_theta=1e6,
                          moe=dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
    # For tests: a dense layer (mlp_only_layers) between sparse ones.
    "qwen3-moe-tiny": dict(arch="qwen3_moe", vocab_size=384, hidden_size=64, intermediate_size=96,
                           num_layers=3, num_heads=2, num_kv_heads=1, head_dim=32, tie=False, rope_theta=1e6,
                           moe=dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])),
}

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def config_json(arch: str, vocab_size: int, hidden_size: int, intermediate_size: int, num_layers: int,
                num_heads: int, num_kv_heads: int, head_dim: int, tie: bool, rope_theta: float,
                bos_token_id: int, eos_token_id: int, max_position_embeddings: int = 8192,
                rope_scaling: dict | None = None, layout: str = "transformers5", moe: dict | None = None) -> dict:
    """rope_scaling: a RoPE type and its fields, e.g. {"rope_type": "yarn", "factor": 4.0}. moe:
    Qwen3-MoE's fields as config.json names them (num_experts, num_experts_per_tok, ...)."""
    cfg = {
        "architectures": [MODEL_TYPES[arch]], "model_type": arch, "vocab_size": vocab_size,
        "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie, "attention_bias": arch == "qwen2",
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, **(moe or {}),
    }
    if layout == "transformers5":
        return {**cfg, "dtype": "bfloat16",
                "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})}}
    if layout == "transformers4":
        return {**cfg, "torch_dtype": "bfloat16", "rope_theta": rope_theta, "rope_scaling": rope_scaling}
    raise ValueError(f"layout must be transformers5 or transformers4, not {layout!r}")


def random_tensors(cfg: dict, generator: torch.Generator, device: str, dtype: torch.dtype, init_std: float) -> dict:
    def normal(*shape, std=init_std):
        return (torch.randn(*shape, generator=generator, device=device, dtype=torch.float32) * std).to(dtype)

    def ones(n):   # norm weights near 1, not exactly: a norm that is skipped must show
        return (1 + normal(n, std=0.1)).to(dtype)

    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]

    def mlp(prefix, inter):
        return {prefix + "gate_proj.weight": normal(inter, h), prefix + "up_proj.weight": normal(inter, h),
                prefix + "down_proj.weight": normal(h, inter)}

    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    t = {"model.embed_tokens.weight": normal(cfg["vocab_size"], h), "model.norm.weight": ones(h)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = normal(cfg["vocab_size"], h)
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = ones(h)
        t[p + "post_attention_layernorm.weight"] = ones(h)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            t[p + f"self_attn.{name}_proj.weight"] = normal(rows, h)
            if cfg["attention_bias"]:
                t[p + f"self_attn.{name}_proj.bias"] = normal(rows, std=0.1)
        t[p + "self_attn.o_proj.weight"] = normal(h, q)
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):
            t[p + "self_attn.q_norm.weight"] = ones(d)
            t[p + "self_attn.k_norm.weight"] = ones(d)
        if sparse(cfg, n):
            t[p + "mlp.gate.weight"] = normal(cfg["num_experts"], h)
            for e in range(cfg["num_experts"]):
                t.update(mlp(f"{p}mlp.experts.{e}.", cfg["moe_intermediate_size"]))
        else:
            t.update(mlp(p + "mlp.", i))
    return t


def sparse(cfg: dict, layer: int) -> bool:
    """Whether a layer of this config.json routes to experts (transformers' Qwen3-MoE rule)."""
    return (cfg.get("num_experts", 0) > 0 and layer not in (cfg.get("mlp_only_layers") or [])
            and (layer + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def write_weights(path: Path, tensors: dict, shards: int) -> None:
    names = list(tensors)
    if shards == 1:
        save_file({n: tensors[n].cpu().contiguous() for n in names}, str(path / "model.safetensors"))
        return
    weight_map, total = {}, 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].cpu().contiguous() for n in names[s::shards]}
        save_file(part, str(path / file))
        weight_map.update({n: file for n in part})
        total += sum(t.numel() * t.element_size() for t in part.values())
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def write_tokenizer(path: Path, tokenizer: Tokenizer, chat_template: str, bos: str | None, eos: str) -> None:
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": bos, "eos_token": eos, "chat_template": chat_template}, indent=2))


def numbered_tokenizer(vocab_size: int, specials: list[str]) -> Tokenizer:
    """A word-level tokenizer covering every id of a large vocabulary: token i is `t{i}`,
    except the last ids, which are the special tokens. Distinct ids give distinct text."""
    words = [f"t{i}" for i in range(vocab_size - len(specials))] + specials
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    return tok


def write_checkpoint(path: str | Path, shape: dict, tokenizer: Tokenizer, *, chat_template: str = CHATML,
                     bos: str | None = None, eos: str = "<|im_end|>", shards: int = 1, seed: int = 0,
                     device: str = "cpu", dtype: torch.dtype = torch.bfloat16, init_std: float = 0.02,
                     layout: str = "transformers5", rope_scaling: dict | None = None,
                     generation: dict | None = None) -> Path:
    """init_std 0.02 is the HF default; tiny models need more to avoid repeating one token.
    generation: the contents of generation_config.json (none is written without it)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    bos_id = tokenizer.token_to_id(bos) if bos else None
    cfg = config_json(**shape, bos_token_id=bos_id, eos_token_id=tokenizer.token_to_id(eos),
                      rope_scaling=rope_scaling, layout=layout)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    generator = torch.Generator(device=device).manual_seed(seed)
    write_weights(path, random_tensors(cfg, generator, device, dtype, init_std), shards)
    write_tokenizer(path, tokenizer, chat_template, bos, eos)
    return path
