"""Every config.json field this engine knows, and what it does with each.

A field the engine does not implement, read as if absent, gives fluent, wrong text with no
error (a GELU model run with SiLU, a bias never added, sliding attention run in full). So
config.json is read against this table: a field is READ (ModelConfig parses and honours it),
INERT (it cannot change which tokens come out: bookkeeping, training-only settings), or
checked (only the values the engine implements pass; any other is refused at start, naming
the file and the field). A field in no table is refused too: a new field is added here once
someone has decided what it means for the engine.

Tables are per architecture (ARCHITECTURE_FIELDS) on top of the shared ones, so that a new
architecture adds its own rows without touching the others'.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A check is given (value, the whole config) and returns why the value is not implemented, or None.
Check = Callable[[Any, dict], "str | None"]
READ = "read"
INERT = "inert"


def only(*allowed, why: str = "") -> Check:
    """The field must hold one of `allowed` (compared as JSON values: False is not 0)."""
    def check(value, raw):
        if any(value == a and type(value) is type(a) for a in allowed) or (value is None and None in allowed):
            return None
        shown = " or ".join(repr(a) for a in allowed)
        return f"{value!r} is not implemented (only {shown}{'; ' + why if why else ''})"
    return check


def _refuse(why: str) -> Check:
    return lambda value, raw: why


def _full_attention_layers(value, raw):
    kinds = set(value or [])
    if kinds - {"full_attention"}:
        return f"{sorted(kinds)} is not implemented: every layer runs full attention here"
    return None


def _no_sliding_window(value, raw):
    if value is True:
        return ("true is not implemented: this engine runs every layer with full attention, which for "
                "a sequence longer than sliding_window gives other text than the model was trained to")
    return only(False, None)(value, raw)


# Fields PretrainedConfig writes for every model, and shape/numerics fields every architecture here reads.
COMMON: dict[str, str | Check] = {
    # read by ModelConfig.from_dir
    "architectures": READ, "vocab_size": READ, "hidden_size": READ, "intermediate_size": READ,
    "num_hidden_layers": READ, "num_attention_heads": READ, "num_key_value_heads": READ, "head_dim": READ,
    "rms_norm_eps": READ, "max_position_embeddings": READ, "tie_word_embeddings": READ, "eos_token_id": READ,
    "dtype": READ, "torch_dtype": READ, "rope_parameters": READ, "rope_scaling": READ, "rope_theta": READ,
    # the activation of the gated MLP: SiLU is what kernels.swiglu computes ("swish" is its other name)
    "hidden_act": only("silu", "swish"),
    "quantization_config": _refuse("quantized checkpoints (fp8, GPTQ, AWQ, ...) are not implemented: their "
                                   "weights would be cast without their scales"),
    "partial_rotary_factor": only(1.0, 1, None),
    # cannot change the tokens: identity, bookkeeping, training-only settings, output switches
    **{name: INERT for name in (
        "model_type", "transformers_version", "_name_or_path", "_model_name_or_path", "bos_token_id",
        "pad_token_id", "unk_token_id", "sep_token_id", "use_cache", "initializer_range", "attention_dropout",
        "id2label", "label2id", "output_attentions", "output_hidden_states", "return_dict", "problem_type",
        "is_encoder_decoder", "chunk_size_feed_forward", "torchscript", "use_bfloat16", "tokenizer_class",
        "pruned_heads", "tie_encoder_decoder", "finetuning_task", "task_specific_params", "prefix",
        "tf_legacy_loss", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
        "decoder_start_token_id", "embd_pdrop", "resid_pdrop", "residual_dropout", "hidden_dropout",
        "_attn_implementation_autoset")},
    # pretraining_tp > 1 slices the same matmuls into pieces in training code; the product is the same
    "pretraining_tp": INERT,
}

LLAMA_LIKE: dict[str, str | Check] = {
    # Llama and Qwen3 put this bias on o_proj as well as q/k/v; this engine adds none on o_proj
    "attention_bias": only(False, None, why="a bias on the q/k/v/o projections"),
    "mlp_bias": only(False, None, why="a bias on the gate/up/down projections"),
}

SLIDING: dict[str, str | Check] = {
    "use_sliding_window": _no_sliding_window,
    "layer_types": _full_attention_layers,
    # inert while use_sliding_window is false (checked above) and every layer is full attention
    "sliding_window": INERT, "max_window_layers": INERT,
}

ARCHITECTURE_FIELDS: dict[str, dict[str, str | Check]] = {
    "llama": {**COMMON, **LLAMA_LIKE},
    # Qwen2 always has q/k/v biases (and none on o_proj), whatever attention_bias says
    "qwen2": {**COMMON, **SLIDING, "attention_bias": INERT, "use_mrope": only(False, None)},
    "qwen3": {**COMMON, **SLIDING, **LLAMA_LIKE},
    # Qwen3-MoE: Qwen3's attention; its sparse layers read by config.Moe
    "qwen3_moe": {**COMMON, **SLIDING, **LLAMA_LIKE, **{name: READ for name in (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
        "mlp_only_layers")},
        # training only: the router's auxiliary loss
        "output_router_logits": INERT, "router_aux_loss_coef": INERT},
}


def problems(arch: str, raw: dict) -> list[str]:
    """'field: why' for each field of `raw` the engine does not implement as given."""
    table = ARCHITECTURE_FIELDS[arch]
    out = []
    for name, value in raw.items():
        rule = table.get(name)
        if rule is None:
            out.append(f"{name}: unknown to this engine, which cannot tell whether it changes the output "
                       f"(known fields: local_backend/config_fields.py)")
        elif callable(rule):
            why = rule(value, raw)
            if why:
                out.append(f"{name}: {why}")
    return out
