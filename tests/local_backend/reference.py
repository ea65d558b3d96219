"""An independent plain-torch forward pass (fp32, whole sequence, no KV cache), written from
the Hugging Face modelling equations and reading the checkpoint by its HF tensor names."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


class ReferenceModel:
    def __init__(self, path: Path):
        self.cfg = json.loads((path / "config.json").read_text())
        self.w = {}
        for f in sorted(path.glob("*.safetensors")):
            self.w.update({k: v.float() for k, v in load_file(str(f)).items()})

    def norm(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"]) * self.w[name]

    def linear(self, x, name, bias=False):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    @staticmethod
    def rotate(x, pos, theta):
        d = x.shape[-1]
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = torch.cat([pos[:, None].double() * inv] * 2, dim=-1)
        half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
        return x * ang.cos().float()[:, None] + half * ang.sin().float()[:, None]

    def logits(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), vocab] next-token logits."""
        c = self.cfg
        n, hq, hkv, d = len(ids), c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        pos = torch.arange(n)
        bias = c["attention_bias"]
        h = self.w["model.embed_tokens.weight"][torch.tensor(ids)]
        mask = torch.full((n, n), float("-inf")).triu(1)
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = self.norm(h, p + "input_layernorm.weight")
            q = self.linear(x, p + "self_attn.q_proj", bias).view(n, hq, d)
            k = self.linear(x, p + "self_attn.k_proj", bias).view(n, hkv, d)
            v = self.linear(x, p + "self_attn.v_proj", bias).view(n, hkv, d)
            if c["model_type"] == "qwen3":
                q = self.norm(q, p + "self_attn.q_norm.weight")
                k = self.norm(k, p + "self_attn.k_norm.weight")
            theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta"))   # either layout
            q, k = self.rotate(q, pos, theta), self.rotate(k, pos, theta)
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
            att = torch.einsum("qhd,khd->hqk", q, k) / d ** 0.5 + mask
            o = torch.einsum("hqk,khd->qhd", att.softmax(-1), v).reshape(n, hq * d)
            h = h + self.linear(o, p + "self_attn.o_proj")
            x = self.norm(h, p + "post_attention_layernorm.weight")
            gate = self.linear(x, p + "mlp.gate_proj")
            h = h + self.linear(torch.nn.functional.silu(gate) * self.linear(x, p + "mlp.up_proj"), p + "mlp.down_proj")
        h = self.norm(h, "model.norm.weight")
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        return h @ head.T

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
        """n greedy tokens (ties to the lowest id) and the log-softmax each was chosen from."""
        ids, logprobs = list(prompt), []
        for _ in range(n):
            lp = self.logits(ids)[-1].log_softmax(-1)
            ids.append(int(torch.argmax(lp)))
            logprobs.append(lp)
        return ids[len(prompt):], logprobs
