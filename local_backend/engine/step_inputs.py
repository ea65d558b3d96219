"""A step's inputs, built on the host and sent to the GPU in one copy.

Every field lives at a fixed offset of one pinned host buffer and of its device twin, so
CUDA graphs read the device views in place and a step costs one transfer instead of one
per tensor (each a host launch, at decode the step's largest host cost after Python).
Per-sequence fields come first, then per-token ones, then the block tables, whose unused
rows are not sent.
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
            ("top_p", torch.float32, max_seqs),
            # per token
            ("ids", torch.int64, max_tokens), ("positions", torch.int64, max_tokens), ("slots", torch.int64, max_tokens),
            ("tables", torch.int32, max_seqs * max_blocks),
        ]
        offsets, at = {}, 0
        for name, dtype, n in fields:
            offsets[name] = at
            at += -(-n * dtype.itemsize // 16) * 16
        gpu = device.type == "cuda"
        self.host_bytes = torch.zeros(at, dtype=torch.uint8, pin_memory=gpu)
        self.device_bytes = torch.zeros(at, dtype=torch.uint8, device=device) if gpu else self.host_bytes
        self.host: dict[str, np.ndarray] = {}
        self.dev: dict[str, torch.Tensor] = {}
        for name, dtype, n in fields:
            span = slice(offsets[name], offsets[name] + n * dtype.itemsize)
            self.host[name] = self.host_bytes[span].view(dtype).numpy()
            self.dev[name] = self.device_bytes[span].view(dtype)
        self.host["tables"] = self.host["tables"].reshape(max_seqs, max_blocks)
        self.dev["tables"] = self.dev["tables"].view(max_seqs, max_blocks)
        self._tables_at, self._row_bytes = offsets["tables"], max_blocks * 4

    def upload(self, table_rows: int) -> None:
        """Send everything the host wrote, block tables up to row table_rows (asynchronous)."""
        if self.device_bytes is not self.host_bytes:
            end = self._tables_at + table_rows * self._row_bytes
            self.device_bytes[:end].copy_(self.host_bytes[:end], non_blocking=True)
