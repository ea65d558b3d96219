"""Load a Hugging Face checkpoint directory into `models.llama.Weights`.

Reads config.json and *.safetensors (one file, or shards listed in
model.safetensors.index.json), fuses q/k/v and gate/up into one matrix each, lays the
matrices out the way kernels.matmul reads them fastest, and hashes every tensor's bytes
on the way so the server can fingerprint exactly which weights it runs.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import xxhash
from safetensors import safe_open
from tqdm import tqdm

from local_backend.config import ModelConfig
from local_backend.models.llama import Layer, Weights


def shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    return files


def read_tensors(path: Path, device: str, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of the checkpoint on `device` in `dtype`, and a digest of their stored bytes."""
    files = shard_files(path)
    digest = xxhash.xxh3_128()
    handles = [safe_open(str(f), framework="pt") for f in files]
    keys = [(h, k) for h in handles for k in h.keys()]
    tensors = {}
    for handle, key in tqdm(sorted(keys, key=lambda hk: hk[1]), desc=f"loading {path.name}", unit="tensor"):
        t = handle.get_tensor(key)
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.contiguous().view(torch.uint8).numpy().data)
        tensors[key] = t.to(device=device, dtype=dtype)
    return tensors, digest.hexdigest()


def matmul_operand(w: torch.Tensor) -> torch.Tensor:
    """An HF [out, in] weight as the [in, out] operand of kernels.matmul (a transposed view)."""
    return w.t()


def build_weights(cfg: ModelConfig, t: dict[str, torch.Tensor]) -> Weights:
    def take(name):
        if name not in t:
            raise KeyError(f"checkpoint lacks {name}")
        return t.pop(name)

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        qkv = torch.cat([take(attn + "q_proj.weight"), take(attn + "k_proj.weight"), take(attn + "v_proj.weight")])
        bias = None
        if cfg.attention_bias:
            bias = torch.cat([take(attn + "q_proj.bias"), take(attn + "k_proj.bias"), take(attn + "v_proj.bias")])
        gate_up = torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")])
        layers.append(Layer(
            input_norm=take(p + "input_layernorm.weight"),
            qkv=matmul_operand(qkv),
            qkv_bias=bias,
            q_norm=take(attn + "q_norm.weight") if cfg.qk_norm else None,
            k_norm=take(attn + "k_norm.weight") if cfg.qk_norm else None,
            o=matmul_operand(take(attn + "o_proj.weight")),
            post_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=matmul_operand(gate_up),
            down=matmul_operand(take(mlp + "down_proj.weight")),
        ))
    embed = take("model.embed_tokens.weight")
    head = embed if cfg.tie_word_embeddings or "lm_head.weight" not in t else take("lm_head.weight")
    return Weights(embed=embed, layers=layers, norm=take("model.norm.weight"), lm_head=matmul_operand(head))


def load_weights(path: str | Path, cfg: ModelConfig, device: str, dtype: torch.dtype) -> tuple[Weights, str]:
    tensors, digest = read_tensors(Path(path), device, dtype)
    return build_weights(cfg, tensors), digest
