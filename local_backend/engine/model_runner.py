"""Turns a scheduled step into tensors, runs the model over the paged KV cache, samples.

Decode-only steps replay a CUDA graph captured at the next padded batch size and the
next KV-length bound (attention may size its work by that bound, so one graph per
power-of-two bound keeps short contexts cheap); padding rows write no KV (slot -1) and
their outputs are dropped. Because the kernels are batch-invariant, a row's bits are the
same whichever graph, or the eager path, served it.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

import kernels
from kernels.sampling import row_filters
from local_backend.engine.scheduler import Scheduled
from local_backend.models.llama import AttentionBatch, Llama

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Sample:
    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()   # (token id, logprob), best first


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


def graph_kv_bounds(max_model_len: int, smallest: int = 256) -> list[int]:
    bounds = []
    while smallest < max_model_len:
        bounds.append(smallest)
        smallest *= 2
    return bounds + [max_model_len]


class ModelRunner:
    def __init__(self, model: Llama, num_blocks: int, block_size: int, max_model_len: int,
                 max_batch: int, use_cuda_graphs: bool):
        cfg = model.cfg
        self.model = model
        self.device = model.w.embed.device
        self.dtype = model.w.embed.dtype
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(cfg.num_layers)]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}   # (batch, kv bound) -> graph
        if use_cuda_graphs and self.device.type == "cuda":
            self._capture(graph_batch_sizes(max_batch), graph_kv_bounds(max_model_len))

    def _tensor(self, values, dtype):
        t = torch.tensor(values, dtype=dtype, pin_memory=self.device.type == "cuda")
        return t.to(self.device, non_blocking=True)

    def _prepare(self, scheduled: list[Scheduled]):
        bs = self.block_size
        ids, positions, slots, cu, kv_lens, tables = [], [], [], [0], [], []
        for item in scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_tokens
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += (seq.block_table[p // bs] * bs + p % bs for p in range(start, end))
            cu.append(cu[-1] + item.num_tokens)
            kv_lens.append(end)
            tables.append(seq.block_table)
        width = max(len(t) for t in tables)
        tables = [t + [0] * (width - len(t)) for t in tables]
        batch = AttentionBatch(
            slot_mapping=self._tensor(slots, torch.int64),
            block_tables=self._tensor(tables, torch.int32),
            cu_seqlens_q=self._tensor(cu, torch.int32),
            kv_lens=self._tensor(kv_lens, torch.int32),
            max_q_len=max(item.num_tokens for item in scheduled),
            max_kv_len=max(kv_lens))
        return self._tensor(ids, torch.int64), self._tensor(positions, torch.int64), batch

    def _capture(self, sizes: list[int], kv_bounds: list[int]) -> None:
        n = max(sizes)
        self.g_ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.g_pos = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.g_slots = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        self.g_tables = torch.zeros(n, self.max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self.g_cu = torch.arange(n + 1, dtype=torch.int32, device=self.device)
        self.g_kv_lens = torch.ones(n, dtype=torch.int32, device=self.device)
        self.g_out = torch.zeros(n, self.model.cfg.hidden_size, dtype=self.dtype, device=self.device)
        self.graph_sizes, self.graph_bounds = sorted(sizes), sorted(kv_bounds)
        pool = None
        for bound in sorted(kv_bounds, reverse=True):
            for b in sorted(sizes, reverse=True):
                batch = AttentionBatch(self.g_slots[:b], self.g_tables[:b], self.g_cu[:b + 1], self.g_kv_lens[:b],
                                       max_q_len=1, max_kv_len=bound)
                args = (self.g_ids[:b], self.g_pos[:b], self.kv_caches, batch)
                self.g_out[:b] = self.model.forward(*args)      # warm-up: compile kernels outside capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.g_out[:b] = self.model.forward(*args)
                pool = graph.pool()
                self.graphs[b, bound] = graph
        torch.cuda.synchronize()
        log.info("captured %d decode CUDA graphs: batch sizes %s x KV bounds %s",
                 len(self.graphs), self.graph_sizes, self.graph_bounds)

    def _decode_graph(self, scheduled: list[Scheduled]) -> torch.Tensor | None:
        if not self.graphs or any(item.num_tokens != 1 for item in scheduled):
            return None
        b = len(scheduled)
        size = min((s for s in self.graph_sizes if s >= b), default=None)
        if size is None:
            return None
        kv_len = max(item.seq.num_computed_tokens + 1 for item in scheduled)
        bound = min(x for x in self.graph_bounds if x >= kv_len)
        ids, pos, batch = self._prepare(scheduled)
        self.g_ids[:b] = ids
        self.g_pos[:b] = pos
        self.g_slots[:b] = batch.slot_mapping
        self.g_slots[b:size] = -1
        self.g_tables[:b, :batch.block_tables.shape[1]] = batch.block_tables
        self.g_kv_lens[:b] = batch.kv_lens
        self.g_kv_lens[b:size] = 1
        self.graphs[size, bound].replay()
        return self.g_out[:b]

    @torch.inference_mode()
    def step(self, scheduled: list[Scheduled]) -> list[Sample]:
        """Run one step; one Sample per scheduled item whose step reaches its last token."""
        hidden = self._decode_graph(scheduled)
        if hidden is None:
            ids, positions, batch = self._prepare(scheduled)
            hidden = self.model.forward(ids, positions, self.kv_caches, batch)
        ends, rows = [], []
        end = 0
        for item in scheduled:
            end += item.num_tokens
            if item.samples:
                ends.append(end - 1)
                rows.append(item.seq)
        if not rows:
            return []
        logits = self.model.logits(hidden[self._tensor(ends, torch.int64)])
        p = [s.params for s in rows]
        tokens = kernels.sample(
            logits,
            self._tensor([x.seed for x in p], torch.int64),
            self._tensor([s.num_generated for s in rows], torch.int64),
            self._tensor([x.temperature for x in p], torch.float32),
            self._tensor([x.top_k for x in p], torch.int32),
            self._tensor([x.top_p for x in p], torch.float32),
            # Known here from the requests' parameters, without a device sync.
            filtered=any(row_filters(x.temperature, x.top_k, x.top_p, logits.shape[-1]) for x in p))
        want = [i for i, x in enumerate(p) if x.logprobs is not None]
        if not want:
            return [Sample(t) for t in tokens.tolist()]
        return self._with_logprobs(logits, tokens, want, [p[i].logprobs for i in want])

    def _with_logprobs(self, logits, tokens, want, ks) -> list[Sample]:
        index = self._tensor(want, torch.int64)
        lp = kernels.log_softmax(logits[index])
        chosen = lp.gather(1, tokens[index].unsqueeze(1)).squeeze(1)
        top_lp, top_ids = torch.topk(lp, max(max(ks), 1), dim=-1)
        tokens, chosen, top_lp, top_ids = tokens.tolist(), chosen.tolist(), top_lp.tolist(), top_ids.tolist()
        out = [Sample(t) for t in tokens]
        for j, (i, k) in enumerate(zip(want, ks)):
            out[i] = Sample(tokens[i], chosen[j], tuple(zip(top_ids[j][:k], top_lp[j][:k])))
        return out
