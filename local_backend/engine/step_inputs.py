"""A step's inputs, built on the host and sent to the GPU in one copy.

Every field lives at a fixed offset of a pinned host buffer and of its device twin, so
CUDA graphs read the device views in place and a step costs one transfer instead of one
per tensor (each a host launch, at decode the step's largest host cost after Python).
Per-sequence fields come first, then per-token ones, then the block tables, whose unused
rows are not sent.

On a GPU there are two host buffers, used in turn: the engine stages a step while the one
before it is still queued (llm_engine.py), whose copy may not have left its buffer yet.
"""
from __future__ import annotations

import numpy as np
import torch


class StepInputs:
    def __init__(self, max_seqs: int, max_tokens: int, max_blocks: int, device: torch.device):
        fields = [
            # per sequence: where its queries sit, how far its KV reaches, the row that samples
            ("cu_seqlens", torch.int32, max_seqs + 1), ("kv_lens", torch.int32, max_seqs),
            ("rows", torch.int64, max_seqs), ("seeds", torch.int64, max_seqs), ("steps", torch.int64, max_seqs),
            ("temperature", torch.float32, max_seqs), ("top_k", torch.int32, max_seqs),
            ("top_p", torch.float32, max_seqs), ("min_p", torch.float32, max_seqs),
            ("penalty", torch.float32, max_seqs),
            # per token; a token still being sampled by the step before is that step's
            # sampled row `ahead_row` where `ahead` is set (ModelRunner.token_ids)
            ("ids", torch.int64, max_tokens), ("positions", torch.int64, max_tokens), ("slots", torch.int64, max_tokens),
            ("ahead_row", torch.int64, max_tokens), ("ahead", torch.bool, max_tokens),
            ("tables", torch.int32, max_seqs * max_blocks),
        ]
        offsets, at = {}, 0
        for name, dtype, n in fields:
            offsets[name] = at
            at += -(-n * dtype.itemsize // 16) * 16
        gpu = device.type == "cuda"
        buffers = [torch.zeros(at, dtype=torch.uint8, pin_memory=gpu) for _ in range(2 if gpu else 1)]
        self.device_bytes = torch.zeros(at, dtype=torch.uint8, device=device) if gpu else buffers[0]
        self._hosts: list[tuple[torch.Tensor, dict[str, np.ndarray], list]] = []
        for buffer in buffers:
            views = {name: buffer[offsets[name]:offsets[name] + n * dtype.itemsize].view(dtype).numpy()
                     for name, dtype, n in fields}
            views["tables"] = views["tables"].reshape(max_seqs, max_blocks)
            # (sequence id, table length) each table row holds: a decode step rewrites only the
            # rows whose sequence moved or grew a block (most rows, most steps, are unchanged).
            self._hosts.append((buffer, views, [None] * max_seqs))
        self.dev: dict[str, torch.Tensor] = {
            name: self.device_bytes[offsets[name]:offsets[name] + n * dtype.itemsize].view(dtype)
            for name, dtype, n in fields}
        self.dev["tables"] = self.dev["tables"].view(max_seqs, max_blocks)
        self._tables_at, self._row_bytes = offsets["tables"], max_blocks * 4
        self.use(0)

    def use(self, slot: int) -> None:
        """Stage the next step in the host buffer of the runner's output slot `slot` (of two; one
        buffer serves both off a GPU, where nothing is queued). The slot's last step was read,
        so its copy is done."""
        self.host_bytes, self.host, self.table_rows = self._hosts[slot % len(self._hosts)]

    def upload(self, table_rows: int) -> None:
        """Send everything the host wrote, block tables up to row table_rows (asynchronous)."""
        if self.device_bytes is not self.host_bytes:
            end = self._tables_at + table_rows * self._row_bytes
            self.device_bytes[:end].copy_(self.host_bytes[:end], non_blocking=True)
