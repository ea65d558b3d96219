"""Batch-invariant kernels and their plain-torch references.

Public API (everything else in detgate relies only on these names):
  matmul(a, b, bias=None)            a: [M, K], b: [K, N] -> [M, N]
  matmul_partials(a, b, bias=None)   the same, or where K splits over programs (decode, batches to
                                     128 rows) its segments' sums (Partials) for
                                     rms_norm_residual / rope_store_kv to add
  launches_early(b)                  whether the kernel ahead of a decode matmul over b lets it launch
                                     early (the `early` of rms_norm_residual, paged_attention)
  rms_norm(x, weight, eps)           one row per program
  rms_norm_residual(x, res, w, eps)  fused residual add + RMSNorm -> (normed, x + res)
  store_kv / paged_attention         paged KV cache write and causal attention
  attention_plan                     what the layers' paged_attention calls of one forward share
  rope_store_kv(qkv, positions, ...) per-head q/k norm + RoPE + KV write in one launch -> q
  silu_mul(x)                        silu(gate) * up of x = [gate | up], one launch
  swiglu(x, w)                       silu_mul(matmul(x, w)), one launch at decode
  moe.route / moe.experts            Qwen3-MoE routing (ties to the lowest expert id) and grouped
                                     experts, each token summed in one order (kernels/moe.py)
  log_softmax / logsumexp / argmax / sample
  set_mode / get_mode / mode         "invariant" | "standard"
  toolchain(device)                  the compiler versions that, with KERNEL_VERSION, fix the bits
"""
from kernels.mode import get_mode, mode, set_mode
from kernels.matmul import launches_early, matmul, matmul_partials, swiglu
from kernels.norm import rms_norm, rms_norm_residual
from kernels.attention import attention_plan, paged_attention, store_kv
from kernels.activation import silu_mul
from kernels.rotary import rope_store_kv
from kernels.sampling import argmax, log_softmax, logsumexp, sample
from kernels.sampling_mask import apply_min_p, apply_repetition_penalty, apply_token_mask
from kernels.toolchain import toolchain
from kernels import moe

# Bump whenever a reduction order changes (e.g. matmul BLOCK_K): that changes output bits.
KERNEL_VERSION = "7"

__all__ = [
    "apply_min_p", "apply_repetition_penalty", "apply_token_mask",
    "KERNEL_VERSION", "argmax", "attention_plan", "get_mode", "launches_early", "log_softmax", "logsumexp",
    "matmul", "matmul_partials", "mode", "paged_attention", "rms_norm", "rms_norm_residual", "rope_store_kv",
    "moe", "sample", "set_mode", "silu_mul", "store_kv", "swiglu", "toolchain",
]
