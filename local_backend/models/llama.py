"""One decoder for Llama, Qwen2 and Qwen3: they differ only in qkv bias and q/k RMSNorm.

Every reduction (matmul, RMSNorm, attention, the logits) goes through `kernels`, whose
invariant mode makes a row's bits independent of the batch around it. The rest is
elementwise and batch-invariant by nature: the embedding gather in torch, RoPE (fused with
the q/k norms and the KV write) in one launch, SiLU*mul in the gate_up matmul's epilogue where
the split kernel runs (kernels.swiglu) and in a launch of its own elsewhere, the residual adds
inside the norms. Fused or not, each of them gives the same bits. At decode the kernel ahead of
a matmul over small weights lets it launch early (kernels.launches_early). Where K splits over
programs, the kernels behind the qkv, o and down projections add those matmuls' K segments
(kernels.matmul_partials): same bits too.
"""
from __future__ import annotations

import dataclasses

import torch

import kernels
from kernels.norm import rms_norm_residual
from local_backend.config import ModelConfig
from local_backend.models.rope_frequencies import inv_freq


@dataclasses.dataclass
class AttentionBatch:
    """Where this step's tokens sit in the paged KV cache (see kernels.paged_attention)."""
    slot_mapping: torch.Tensor   # [T] int64, -1 = write nothing (padding)
    block_tables: torch.Tensor   # [S, max_blocks] int32
    cu_seqlens_q: torch.Tensor   # [S+1] int32
    kv_lens: torch.Tensor        # [S] int32, cached prefix + this step's tokens
    max_q_len: int
    max_kv_len: int
    plan: object = None          # kernels.attention_plan of the above, shared by every layer


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


class Llama:
    def __init__(self, cfg: ModelConfig, weights: Weights, max_positions: int):
        self.cfg = cfg
        self.w = weights
        device = weights.embed.device
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq(cfg.rope, cfg.head_dim))
        self.cos = (angles.cos() * cfg.rope.attention_factor).float().to(device)   # [P, D/2]
        self.sin = (angles.sin() * cfg.rope.attention_factor).float().to(device)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.scale = cfg.head_dim ** -0.5

    def attention(self, layer: Layer, x, positions, kv_cache, batch: AttentionBatch):
        cfg, t = self.cfg, x.shape[0]
        qkv = kernels.matmul_partials(x, layer.qkv, layer.qkv_bias)
        k_cache, v_cache = kv_cache
        # Rotate-half (GPT-NeoX) RoPE, as in the HF Llama/Qwen checkpoints; Qwen3 norms q and k first.
        q = kernels.rope_store_kv(qkv, positions, self.cos, self.sin, k_cache, v_cache, batch.slot_mapping,
                                  cfg.num_heads, cfg.num_kv_heads, layer.q_norm, layer.k_norm, cfg.rms_norm_eps)
        o = kernels.paged_attention(
            q, k_cache, v_cache, batch.block_tables, batch.cu_seqlens_q, batch.kv_lens, self.scale,
            max_q_len=batch.max_q_len, max_kv_len=batch.max_kv_len, plan=batch.plan,
            early=kernels.launches_early(layer.o))
        return kernels.matmul_partials(o.reshape(t, self.q_size), layer.o)

    def mlp_weight(self, layer: Layer) -> torch.Tensor:
        """The first matmul's weight of a layer's MLP: the norm ahead of it may launch it early."""
        return layer.gate_up

    def mlp(self, layer: Layer, x):
        return kernels.matmul_partials(kernels.swiglu(x, layer.gate_up), layer.down)

    def forward(self, input_ids, positions, kv_caches, batch: AttentionBatch) -> torch.Tensor:
        """Hidden states [T, H] after the final norm, one row per input token."""
        eps = self.cfg.rms_norm_eps
        layers = self.w.layers
        batch = dataclasses.replace(batch, plan=kernels.attention_plan(
            kv_caches[0][0], batch.block_tables, batch.cu_seqlens_q, batch.kv_lens, batch.max_kv_len))
        # Each residual add is fused into the norm that follows it: h carries the stream.
        h = self.w.embed[input_ids]
        x = kernels.rms_norm(h, layers[0].input_norm, eps)
        for i, (layer, kv_cache) in enumerate(zip(layers, kv_caches)):
            x, h = rms_norm_residual(self.attention(layer, x, positions, kv_cache, batch), h, layer.post_norm, eps,
                                     early=kernels.launches_early(self.mlp_weight(layer)))
            # The next layer's norm and qkv, or the final norm and the LM head.
            norm, weight = (layers[i + 1].input_norm, layers[i + 1].qkv) if i + 1 < len(layers) else \
                (self.w.norm, self.w.lm_head)
            x, h = rms_norm_residual(self.mlp(layer, x), h, norm, eps, early=kernels.launches_early(weight))
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """In the model's dtype: the sampler draws from bf16 the tokens it draws from their fp32
        upcast (bench/results/kernels_decode_options.md) and reads half the bytes; log_softmax's
        bits differ, so logprobs take the upcast."""
        return kernels.matmul(hidden, self.w.lm_head)
