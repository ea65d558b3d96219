"""What the backend is told: the model's shape (from config.json) and the engine's knobs."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import xxhash

from local_backend import config_fields, rope
from local_backend.errors import CheckpointError
from local_backend.generation_config import GenerationConfig, token_ids

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
DTYPES = ("float32", "float16", "bfloat16")
# Every file besides the weights whose bytes can change an answer: the model's settings,
# the tokenizer and the chat template (the fingerprint digests them).
SETTINGS_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "chat_template.jinja")


@dataclasses.dataclass(frozen=True)
class Moe:
    """Qwen3-MoE's sparse layers: which layers route, to how many of how many experts."""
    num_experts: int
    top_k: int                      # num_experts_per_tok
    intermediate_size: int          # moe_intermediate_size, each expert's
    normalize: bool                 # norm_topk_prob: the chosen experts' weights sum to 1
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP of intermediate_size

    @classmethod
    def parse(cls, raw: dict, file: str, num_layers: int, need) -> "Moe":
        experts, top_k = need("num_experts"), need("num_experts_per_tok")
        if top_k > experts:
            raise CheckpointError(f"{file}: num_experts_per_tok {top_k} is more than num_experts {experts}")
        step = raw.get("decoder_sparse_step", 1)
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
            raise CheckpointError(f"{file}: decoder_sparse_step must be a positive int, got {step!r}")
        dense = raw.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
            raise CheckpointError(f"{file}: mlp_only_layers must be a list of layer indices, got {dense!r}")
        # transformers' rule: a layer routes unless listed, when (index + 1) is a multiple of the step.
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
        return cls(experts, top_k, need("moe_intermediate_size"), bool(raw.get("norm_topk_prob", False)), sparse)


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
    rope: rope.Rope
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool   # bias on q/k/v projections (Qwen2)
    qk_norm: bool          # per-head RMSNorm on q and k before RoPE (Qwen3)
    eos_token_ids: tuple[int, ...]
    dtype: str | None      # the dtype the checkpoint says it was saved in (`dtype`, formerly `torch_dtype`)
    generation: GenerationConfig
    moe: Moe | None = None   # Qwen3-MoE's experts; None for a dense model

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        file = path / "config.json"
        if not file.exists():
            raise CheckpointError(f"{file}: no such file (is {path} a Hugging Face checkpoint directory?)")
        try:
            raw = json.loads(file.read_text())
        except ValueError as e:
            raise CheckpointError(f"{file}: not valid JSON ({e})") from None

        def need(name: str, kind=int):
            value = raw.get(name)
            if value is None:
                raise CheckpointError(f"{file}: missing field {name}")
            if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
                raise CheckpointError(f"{file}: {name} must be a positive {kind.__name__}, got {value!r}")
            return value

        archs = raw.get("architectures") or []
        known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
        if not known:
            raise CheckpointError(f"{file}: architectures {archs} unsupported; supported: {sorted(ARCHITECTURES)}")
        arch = known[0]
        unimplemented = config_fields.problems(arch, raw)
        if unimplemented:
            raise CheckpointError(f"{file}: " + "; ".join(unimplemented))
        heads = need("num_attention_heads")
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise CheckpointError(f"{file}: num_attention_heads {heads} is not a multiple of "
                                  f"num_key_value_heads {kv_heads}")
        head_dim = raw.get("head_dim") or need("hidden_size") // heads
        dtype = raw.get("dtype", raw.get("torch_dtype"))
        if dtype is not None and dtype not in DTYPES:
            raise CheckpointError(f"{file}: dtype {dtype!r} is not one of {list(DTYPES)}")
        rope_settings = rope.parse(raw, str(file))
        generation = GenerationConfig.from_dir(path)
        eos = generation.eos_token_ids
        if eos is None:
            eos = () if raw.get("eos_token_id") is None else token_ids(raw["eos_token_id"], f"{file}: eos_token_id")
        vocab = need("vocab_size")
        layers = need("num_hidden_layers")
        moe = Moe.parse(raw, str(file), layers, need) if arch == "qwen3_moe" else None
        if any(i >= vocab for i in eos):
            raise CheckpointError(f"{path}: eos_token_id {list(eos)} reaches past config.json's vocab_size {vocab}")
        return cls(
            arch=arch,
            vocab_size=vocab,
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=rope_settings,
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=arch == "qwen2",   # Llama's and Qwen3's attention_bias is refused (config_fields)
            qk_norm=arch in ("qwen3", "qwen3_moe"),
            eos_token_ids=eos,
            dtype=dtype,
            generation=generation,
            moe=moe,
        )


def settings_digest(path: str | Path, chat_template: str | Path | None = None) -> str:
    """A digest of the bytes of every SETTINGS_FILES file present (absent ones count as absent),
    and of the chat template the operator put in the checkpoint's place, if any."""
    digest = xxhash.xxh3_128()
    files = [(name, Path(path) / name) for name in SETTINGS_FILES]
    if chat_template is not None:
        files.append(("--chat-template", Path(chat_template)))
    for name, file in files:
        data = file.read_bytes() if file.exists() else None
        digest.update(f"{name}|{-1 if data is None else len(data)}|".encode())
        digest.update(data or b"")
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    model: str
    device: str | None = "cuda"   # None: cuda when available, else cpu (decided where torch is)
    mode: str = "invariant"
    max_batch: int = 256           # sequences per engine step
    kv_blocks: int = 0             # 0: size the cache from free device memory
    block_size: int = 16
    chunk_size: int = 512          # prefill chunk per sequence; boundaries at multiples of it
    max_batched_tokens: int = 4096  # token budget of one engine step
    max_model_len: int | None = None   # None: the checkpoint's own context (max_position_embeddings)
    cuda_graphs: bool = True
    prefix_caching: bool | None = None   # None: on with a GPU; off on the CPU (see Engine)
    gpu_memory_fraction: float = 0.85
    audit_rate: float = 0.0
    chat_template: str | None = None   # a template file served in place of the checkpoint's

    def __post_init__(self):
        if self.chunk_size % self.block_size:
            raise ValueError("chunk_size must be a multiple of block_size")
        if self.max_batched_tokens < self.chunk_size:
            raise ValueError("max_batched_tokens must be at least chunk_size")
        if not 0.0 <= self.audit_rate <= 1.0:
            raise ValueError("audit_rate must be in [0, 1]")
