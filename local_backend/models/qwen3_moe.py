"""Qwen3-MoE: Qwen3's decoder whose sparse layers route each token to its top k experts.

Attention, norms and the dense layers (mlp_only_layers, decoder_sparse_step) are Llama's
(models/llama.py). A sparse layer's MLP is the router's logits through the invariant matmul, then
kernels.moe: routing one token per program (ties to the lowest expert id, the weights normalised
in a fixed order) and experts whose every row is summed in one order whatever else is in the
batch (kernels/moe.py says how).
"""
from __future__ import annotations

import dataclasses

import torch

import kernels
from kernels import moe
from local_backend.models.llama import Layer, Llama


@dataclasses.dataclass
class Experts:
    router: torch.Tensor    # [H, E], laid out for kernels.matmul
    gate_up: torch.Tensor   # [E, 2I, H]: each expert's [gate | up] rows, as the checkpoint stores them
    down: torch.Tensor      # [E, H, I]


@dataclasses.dataclass
class MoeLayer(Layer):
    experts: Experts | None = None   # a sparse layer's; gate_up and down are then None


class Qwen3Moe(Llama):
    def mlp_weight(self, layer: MoeLayer) -> torch.Tensor:
        return layer.experts.router if layer.experts is not None else layer.gate_up

    def mlp(self, layer: MoeLayer, x):
        if layer.experts is None:
            return super().mlp(layer, x)
        spec, ex = self.cfg.moe, layer.experts
        weights, ids = moe.route(kernels.matmul(x, ex.router), spec.top_k, spec.normalize)
        return moe.experts(x, weights, ids, ex.gate_up, ex.down)


def model_class(cfg) -> type[Llama]:
    return Qwen3Moe if cfg.moe is not None else Llama
