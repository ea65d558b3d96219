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
from local_backend.errors import CheckpointError
from local_backend.models.llama import Layer, Weights
from local_backend.models.qwen3_moe import Experts, MoeLayer


INDEX = "model.safetensors.index.json"


def shard_files(path: Path) -> list[Path]:
    index = path / INDEX
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index}: no weight_map of tensor names to files ({e!r})") from None
        missing = [n for n in names if not (path / n).exists()]
        if missing:
            raise CheckpointError(f"{index}: weight_map names {', '.join(missing)}, missing from {path}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files and no {INDEX}")
    return files


def read_tensors(path: Path, device: str, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], str, dict[str, str]]:
    """All tensors of the checkpoint on `device` in `dtype`, a digest of their stored bytes, and
    the file each came from."""
    files = shard_files(path)
    digest = xxhash.xxh3_128()
    handles = [(f.name, _open(f)) for f in files]
    keys = [(name, h, k) for name, h in handles for k in h.keys()]
    tensors, origin = {}, {}
    for name, handle, key in tqdm(sorted(keys, key=lambda nhk: nhk[2]), desc=f"loading {path.name}", unit="tensor"):
        if key in origin:
            raise CheckpointError(f"{path}: tensor {key} is in both {origin[key]} and {name}")
        try:
            t = handle.get_tensor(key)
        except Exception as e:   # safetensors raises its own error types, and torch others for a bad dtype
            raise CheckpointError(f"{path / name}: tensor {key} cannot be read ({e})") from None
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.contiguous().view(torch.uint8).numpy().data)
        tensors[key] = t.to(device=device, dtype=dtype)
        origin[key] = name
    return tensors, digest.hexdigest(), origin


def _open(file: Path):
    """A safetensors file opened for reading, or an error naming it (a truncated download, a
    file that is not safetensors)."""
    try:
        return safe_open(str(file), framework="pt")
    except Exception as e:   # safetensors' SafetensorError, an OSError, ...
        raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None


# Tensors a checkpoint may hold that are derived from config.json and that transformers
# ignores on load too: old Llama checkpoints saved RoPE's inverse frequencies.
DERIVED_SUFFIXES = (".rotary_emb.inv_freq",)


def refuse_unused(t: dict[str, torch.Tensor], origin: dict[str, str]) -> None:
    """Every tensor of a checkpoint is either used or the checkpoint is refused: a tensor left
    over is a part of the model (a bias, a quantization scale, a layer past num_hidden_layers)
    this engine would silently run without."""
    unused = sorted(k for k in t if not k.endswith(DERIVED_SUFFIXES))
    if unused:
        shown = ", ".join(f"{k} ({origin[k]})" for k in unused[:8])
        more = f" and {len(unused) - 8} more" if len(unused) > 8 else ""
        raise CheckpointError(f"{len(unused)} tensor(s) this engine does not implement: {shown}{more}")


def matmul_operand(w: torch.Tensor) -> torch.Tensor:
    """An HF [out, in] weight as the [in, out] operand of kernels.matmul (a transposed view)."""
    return w.t()


def build_weights(cfg: ModelConfig, t: dict[str, torch.Tensor], origin: dict[str, str]) -> Weights:
    """The model's weights, each checked against the shape config.json implies."""
    files = sorted(set(origin.values()))
    h, d, inter, vocab = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d

    def take(name, shape, fields):
        if name not in t:
            raise CheckpointError(f"tensor {name} is in none of {', '.join(files)}")
        if tuple(t[name].shape) != shape:
            raise CheckpointError(f"{origin[name]}: tensor {name} is {list(t[name].shape)}, but config.json "
                                  f"({fields}) makes it {list(shape)}")
        return t.pop(name)

    heads = "num_attention_heads, head_dim, hidden_size"
    kv_heads = "num_key_value_heads, head_dim, hidden_size"
    mlp_fields = "intermediate_size, hidden_size"
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        qkv = torch.cat([take(attn + "q_proj.weight", (q, h), heads), take(attn + "k_proj.weight", (kv, h), kv_heads),
                         take(attn + "v_proj.weight", (kv, h), kv_heads)])
        bias = None
        if cfg.attention_bias:
            bias = torch.cat([take(attn + "q_proj.bias", (q,), heads), take(attn + "k_proj.bias", (kv,), kv_heads),
                              take(attn + "v_proj.bias", (kv,), kv_heads)])
        sparse = cfg.moe is not None and cfg.moe.sparse_layers[i]
        gate_up = down = experts = None
        if sparse:
            experts = take_experts(cfg, take, mlp, fused=mlp + "experts.gate_up_proj" in t)
        else:
            gate_up = matmul_operand(torch.cat([take(mlp + "gate_proj.weight", (inter, h), mlp_fields),
                                                take(mlp + "up_proj.weight", (inter, h), mlp_fields)]))
            down = matmul_operand(take(mlp + "down_proj.weight", (h, inter), mlp_fields))
        layers.append((MoeLayer if cfg.moe is not None else Layer)(
            input_norm=take(p + "input_layernorm.weight", (h,), "hidden_size"),
            qkv=matmul_operand(qkv),
            qkv_bias=bias,
            q_norm=take(attn + "q_norm.weight", (d,), "head_dim") if cfg.qk_norm else None,
            k_norm=take(attn + "k_norm.weight", (d,), "head_dim") if cfg.qk_norm else None,
            o=matmul_operand(take(attn + "o_proj.weight", (h, q), heads)),
            post_norm=take(p + "post_attention_layernorm.weight", (h,), "hidden_size"),
            gate_up=gate_up,
            down=down,
            **({"experts": experts} if cfg.moe is not None else {}),
        ))
    embed = take("model.embed_tokens.weight", (vocab, h), "vocab_size, hidden_size")
    if cfg.tie_word_embeddings:
        head = embed   # transformers ties them too, whatever lm_head.weight a checkpoint also holds
        t.pop("lm_head.weight", None)
    elif "lm_head.weight" in t:
        head = take("lm_head.weight", (vocab, h), "vocab_size, hidden_size")
    else:
        raise CheckpointError(f"config.json: tie_word_embeddings is false, but lm_head.weight is in none of "
                              f"{', '.join(files)}")
    weights = Weights(embed=embed, layers=layers, norm=take("model.norm.weight", (h,), "hidden_size"),
                      lm_head=matmul_operand(head))
    refuse_unused(t, origin)
    return weights


def take_experts(cfg: ModelConfig, take, mlp: str, fused: bool) -> Experts:
    """A sparse layer's router and experts, each expert's gate and up stacked as [E, 2I, H] and its
    down as [E, H, I]: the layout kernels.moe reads (rows = outputs, as stored). fused: the
    checkpoint stores them so (transformers 5's module layout), not one tensor per expert."""
    h, spec = cfg.hidden_size, cfg.moe
    n, i, fields = spec.num_experts, spec.intermediate_size, "num_experts, moe_intermediate_size, hidden_size"
    router = take(mlp + "gate.weight", (n, h), "num_experts, hidden_size")
    if fused:
        return Experts(router=matmul_operand(router), gate_up=take(mlp + "experts.gate_up_proj", (n, 2 * i, h), fields),
                       down=take(mlp + "experts.down_proj", (n, h, i), fields))
    gate_up, down = [], []
    for e in range(spec.num_experts):
        p = f"{mlp}experts.{e}."
        gate_up.append(torch.cat([take(p + "gate_proj.weight", (i, h), fields), take(p + "up_proj.weight", (i, h), fields)]))
        down.append(take(p + "down_proj.weight", (h, i), fields))
    return Experts(router=matmul_operand(router), gate_up=torch.stack(gate_up), down=torch.stack(down))


def load_weights(path: str | Path, cfg: ModelConfig, device: str, dtype: torch.dtype) -> tuple[Weights, str]:
    tensors, digest, origin = read_tensors(Path(path), device, dtype)
    return build_weights(cfg, tensors, origin), digest
