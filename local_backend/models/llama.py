"""One decoder for Llama, Qwen2 and Qwen3: they differ only in qkv bias and q/k RMSNorm.

Every reduction (matmul, RMSNorm, attention, the logits) goes through `kernels`, whose
invariant mode makes a row's bits independent of the batch around it. What stays in
plain torch is elementwise (embedding gather, RoPE, SiLU*mul, residual add), which is
batch-invariant by nature.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

import kernels
from kernels.norm import rms_norm_residual
from local_backend.config import ModelConfig


@dataclasses.dataclass
class AttentionBatch:
    """Where this step's tokens sit in the paged KV cache (see kernels.paged_attention)."""
    slot_mapping: torch.Tensor   # [T] int64, -1 = write nothing (padding)
    block_tables: torch.Tensor   # [S, max_blocks] int32
    cu_seqlens_q: torch.Tensor   # [S+1] int32
    kv_lens: torch.Tensor        # [S] int32, cached prefix + this step's tokens
    max_q_len: int
    max_kv_len: int


@dataclasses.dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor            # [hidden, (Hq + 2 Hkv) * head_dim], laid out for kernels.matmul
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor        # [hidden, 2 * intermediate]
    down: torch.Tensor


@dataclasses.dataclass
class Weights:
    embed: torch.Tensor          # [V, H], the HF layout: rows are gathered
    layers: list[Layer]
    norm: torch.Tensor
    lm_head: torch.Tensor        # [H, V]


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling {scaling}")
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, out)


class Llama:
    def __init__(self, cfg: ModelConfig, weights: Weights, max_positions: int):
        self.cfg = cfg
        self.w = weights
        device = weights.embed.device
        inv_freq = rope_inv_freq(cfg)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        self.cos = angles.cos().float().to(device)   # [P, D/2]
        self.sin = angles.sin().float().to(device)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim ** -0.5

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Rotate-half (GPT-NeoX) layout, as in the HF Llama/Qwen checkpoints.
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def attention(self, layer: Layer, x, positions, kv_cache, batch: AttentionBatch):
        cfg, t = self.cfg, x.shape[0]
        qkv = kernels.matmul(x, layer.qkv, layer.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(t, cfg.num_heads, cfg.head_dim)
        k = k.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = kernels.rms_norm(q.reshape(-1, cfg.head_dim), layer.q_norm, cfg.rms_norm_eps).view_as(q)
            k = kernels.rms_norm(k.reshape(-1, cfg.head_dim), layer.k_norm, cfg.rms_norm_eps).view_as(k)
        q, k = self.rope(q, positions), self.rope(k, positions)
        k_cache, v_cache = kv_cache
        kernels.store_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        o = kernels.paged_attention(
            q, k_cache, v_cache, batch.block_tables, batch.cu_seqlens_q, batch.kv_lens, self.scale,
            max_q_len=batch.max_q_len, max_kv_len=batch.max_kv_len)
        return kernels.matmul(o.reshape(t, self.q_size), layer.o)

    def mlp(self, layer: Layer, x):
        gate, up = kernels.matmul(x, layer.gate_up).chunk(2, dim=-1)
        return kernels.matmul(F.silu(gate) * up, layer.down)

    def forward(self, input_ids, positions, kv_caches, batch: AttentionBatch) -> torch.Tensor:
        """Hidden states [T, H] after the final norm, one row per input token."""
        eps = self.cfg.rms_norm_eps
        layers = self.w.layers
        # Each residual add is fused into the norm that follows it: h carries the stream.
        h = self.w.embed[input_ids]
        x = kernels.rms_norm(h, layers[0].input_norm, eps)
        for i, (layer, kv_cache) in enumerate(zip(layers, kv_caches)):
            x, h = rms_norm_residual(self.attention(layer, x, positions, kv_cache, batch), h, layer.post_norm, eps)
            next_norm = layers[i + 1].input_norm if i + 1 < len(layers) else self.w.norm
            x, h = rms_norm_residual(self.mlp(layer, x), h, next_norm, eps)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return kernels.matmul(hidden, self.w.lm_head).float()
