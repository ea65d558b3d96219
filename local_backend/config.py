"""What the backend is told: the model's shape (from config.json) and the engine's knobs."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool   # bias on q/k/v projections (Qwen2 always, Llama when configured)
    qk_norm: bool          # per-head RMSNorm on q and k before RoPE (Qwen3)
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        raw = json.loads((path / "config.json").read_text())
        archs = raw.get("architectures") or []
        known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
        if not known:
            raise ValueError(f"unsupported architectures {archs}; supported: {sorted(ARCHITECTURES)}")
        arch = known[0]
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        eos = raw.get("eos_token_id")
        generation = path / "generation_config.json"
        if generation.exists():
            eos = json.loads(generation.read_text()).get("eos_token_id", eos)
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            arch=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=raw.get("rope_theta", 10000.0),
            rope_scaling=raw.get("rope_scaling"),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=arch == "qwen2" or raw.get("attention_bias", False),
            qk_norm=arch == "qwen3",
            eos_token_ids=eos_ids,
        )


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    model: str
    device: str = "cuda"
    mode: str = "invariant"
    max_batch: int = 256           # sequences per engine step
    kv_blocks: int = 0             # 0: size the cache from free device memory
    block_size: int = 16
    chunk_size: int = 512          # prefill chunk per sequence; boundaries at multiples of it
    max_batched_tokens: int = 4096  # token budget of one engine step
    max_model_len: int = 4096
    cuda_graphs: bool = True
    prefix_caching: bool | None = None   # None: on with a GPU; off on the CPU (see Engine)
    gpu_memory_fraction: float = 0.85
    audit_rate: float = 0.0

    def __post_init__(self):
        if self.chunk_size % self.block_size:
            raise ValueError("chunk_size must be a multiple of block_size")
        if self.max_batched_tokens < self.chunk_size:
            raise ValueError("max_batched_tokens must be at least chunk_size")
        if not 0.0 <= self.audit_rate <= 1.0:
            raise ValueError("audit_rate must be in [0, 1]")
