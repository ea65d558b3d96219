"""Turns a scheduled step into tensors, runs the model over the paged KV cache, samples.

A step's inputs go to the GPU in one copy (step_inputs.py). Decode-only steps replay a
CUDA graph captured at the next padded batch size and the next KV-length bound
(attention may size its work by that bound, so one graph per power-of-two bound keeps
short contexts cheap); padding rows write no KV (slot -1) and their outputs are dropped.
In invariant mode, steps that prefill (alone or among decodes) replay a graph captured
at the next power-of-two token count: an eager step launches some 300 Triton kernels,
whose host cost is several times their GPU time at a chunk of 512 tokens. Its padding
tokens form extra sequences of at most a chunk each and its unused sequence slots are
empty; prefill
attention does not size its launch by the KV bound, so one graph per token count does.
The logits and the sampler (and the sampled tokens' logprobs, when a row asks) are a
third graph per padded row count, replayed after whichever forward ran. Because the
kernels are batch-invariant, a row's bits are the same whichever graph, or the eager
path, served it. Standard mode keeps prefill and sampling eager: its attention gathers
pages into a buffer sized by the KV bound (kernels/attention_vendor.py), which a graph
for every prefill shape would hold for every sequence slot; its torch sampler stays eager, as
stock engines run theirs.

launch() queues a step and finish() reads its tokens; two steps may be in flight, each with
its own host input buffer, output slot and timing marks. A token the step ahead is still
sampling reaches the next step's inputs on the GPU: the head writes its tokens to `sampled`,
and the forward takes a flagged input position from there (_token_ids).

Prompt logprobs (a prompt token's logprob given the tokens before it) are computed from
the hidden states of the prefill chunk that holds the position before it, through the
same logits and log-softmax as a sampled token's: scoring a finished sequence again
gives its tokens the logprobs they were sampled with, bit for bit.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable

import numpy as np
import torch

import kernels
from kernels.sampling import row_filters
from local_backend.engine.messages import Sample
from local_backend.engine.row_mask import fill_rows, fill_seen
from local_backend.engine.scheduler import Scheduled
from local_backend.engine.sequence import PENDING
from local_backend.engine.step_inputs import StepInputs
from local_backend.models.llama import AttentionBatch, Llama

log = logging.getLogger(__name__)

TOP_LOGPROBS = 20   # the most top_logprobs a request may ask for (protocol.py)
OUTPUTS = ("tokens", "chosen", "top_lp", "top_ids")   # what _head returns: the tokens, then with logprobs the rest


@dataclasses.dataclass
class StepOutput:
    sampled: list                                          # the Sequence of each item whose step reaches its last token
    samples: list[Sample]                                  # one per sequence in `sampled`
    gpu_seconds: dict[str, float]                          # GPU time by phase ("forward", "sampler"); CUDA only


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


def doublings(limit: int, smallest: int) -> list[int]:
    """smallest, 2 * smallest, ... below limit, then limit: the token counts (from 64) and KV
    bounds (from 256) that graphs are captured at."""
    sizes = []
    while smallest < limit:
        sizes.append(smallest)
        smallest *= 2
    return sizes + [limit]


@dataclasses.dataclass
class _Staged:
    tokens: int
    seqs: int
    sampled: list                 # the Sequence of each sampled row, in row order
    max_q_len: int
    max_kv_len: int
    filtered: bool                # some sampled row uses top-k / top-p
    logprobs: bool                # some sampled row wants logprobs
    scored: list                  # (Scheduled, its first hidden row) of each item that asks for prompt logprobs
    masked: bool = False          # some sampled row is constrained (RowMask) or floored (min_p): the head runs eagerly
    follows_tokens: bool = False  # some row's mask needs this step's token before the next step stages


@dataclasses.dataclass
class Launched:
    """A step queued on the GPU whose tokens the host has not read yet (ModelRunner.finish)."""
    staged: _Staged
    slot: int                                  # its GPU marks and host output buffers
    prompt_logprobs: dict[int, list[Sample]]   # seq_id -> this step's new entries (read at launch)


class ModelRunner:
    def __init__(self, model: Llama, num_blocks: int, block_size: int, max_model_len: int,
                 max_batch: int, max_tokens: int, chunk_size: int, use_cuda_graphs: bool):
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
        max_tokens = max(max_tokens, max_batch)
        self.max_model_len, self.chunk_size = max_model_len, chunk_size
        # A prefill graph's padding tokens are more sequences, of a chunk at most (as real ones).
        self.pad_piece = min(chunk_size, max_model_len)
        self.max_seqs = max_batch + -(-max_tokens // self.pad_piece)
        self.inputs = StepInputs(self.max_seqs, max_tokens, self.max_blocks_per_seq, self.device)
        self.hidden = torch.zeros(max_tokens, cfg.hidden_size, dtype=self.dtype, device=self.device)
        # The last step's sampled tokens, on the GPU: the next step, queued before the host has
        # read them, takes its inputs from here (_token_ids).
        self.sampled = torch.zeros(max_batch, dtype=torch.int64, device=self.device)
        self._ahead_rows: dict = {}   # Sequence -> its row in `sampled` after the last launched step
        gpu = self.device.type == "cuda"
        # Two steps may be in flight (queued, and its successor being staged), each with its own
        # slot: where its sampled tokens (and their logprobs) land on the host, pinned, and marks
        # on the GPU's timeline (step start, forward done, sampler done; the last is also what
        # the host waits on).
        self.slots = [({name: torch.zeros(shape, dtype=dtype, pin_memory=gpu) for name, shape, dtype in (
            ("tokens", (max_batch,), torch.int64), ("chosen", (max_batch,), torch.float32),
            ("top_lp", (max_batch, TOP_LOGPROBS), torch.float32), ("top_ids", (max_batch, TOP_LOGPROBS), torch.int64))},
            [torch.cuda.Event(enable_timing=True) for _ in range(3)] if gpu else None) for _ in range(2)]
        # Token masks of constrained rows (engine/row_mask.py), one host buffer per slot as above.
        words = -(-cfg.vocab_size // 32)
        self.masks_host = [torch.full((max_batch, words), -1, dtype=torch.int32, pin_memory=gpu) for _ in range(2)]
        self.masks = torch.full((max_batch, words), -1, dtype=torch.int32, device=self.device)
        # The tokens each row has seen, for a repetition penalty (the same layout, zero: none).
        self.seen_host = [torch.zeros((max_batch, words), dtype=torch.int32, pin_memory=gpu) for _ in range(2)]
        self.seen = torch.zeros((max_batch, words), dtype=torch.int32, device=self.device)
        self._slot = 0
        self._in_flight = [False, False]
        self.stream = torch.cuda.current_stream(self.device) if gpu else None   # looked up once: ~30 us a call
        self.forward_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}   # (batch, kv bound)
        self.prefill_graphs: dict[int, torch.cuda.CUDAGraph] = {}                # tokens
        self.head_graphs: dict[tuple[int, bool, bool], tuple] = {}   # (rows, filtered, logprobs) -> graph, outputs
        self.graph_sizes = graph_batch_sizes(max_batch)
        self.graph_bounds = doublings(max_model_len, 256)
        self.graph_tokens = doublings(max_tokens, 64)
        if use_cuda_graphs and gpu:
            self._capture()

    # ---- inputs --------------------------------------------------------------------

    def _pad(self, first_seq: int, seqs: int, first_token: int, tokens: int) -> None:
        """Padding rows of a graph: one-token sequences that read position 0 and write no KV."""
        h = self.inputs.host
        h["cu_seqlens"][first_seq + 1:seqs + 1] = np.arange(first_token + 1, first_token + 1 + seqs - first_seq)
        h["kv_lens"][first_seq:seqs] = 1
        h["tables"][first_seq:seqs, 0] = 0
        self.inputs.table_rows[first_seq:seqs] = [None] * (seqs - first_seq)
        h["ids"][first_token:tokens] = 0
        h["ahead"][first_token:tokens] = False
        h["positions"][first_token:tokens] = 0
        h["slots"][first_token:tokens] = -1

    def _pad_prefill(self, seqs: int, tokens: int, size: int) -> None:
        """A prefill graph's padding: tokens up to `size` as more sequences of pad_piece tokens
        at most (positions 0.., no KV written), then empty sequences up to every slot."""
        h, pad, piece = self.inputs.host, size - tokens, self.pad_piece
        lens = [piece] * (pad // piece) + ([pad % piece] if pad % piece else [])
        end = seqs + len(lens)
        h["cu_seqlens"][seqs + 1:end + 1] = tokens + np.cumsum(lens, dtype=np.int64)
        h["cu_seqlens"][end + 1:self.max_seqs + 1] = size
        h["kv_lens"][seqs:end] = lens
        h["kv_lens"][end:self.max_seqs] = 1
        h["ids"][tokens:size] = 0
        h["ahead"][tokens:size] = False
        h["positions"][tokens:size] = np.arange(pad) % piece
        h["slots"][tokens:size] = -1

    def _pad_rows(self, first: int, rows: int) -> None:
        """Padding rows of the sampler: greedy draws from hidden row 0, dropped."""
        h = self.inputs.host
        h["rows"][first:rows] = 0
        h["seeds"][first:rows] = 0
        h["steps"][first:rows] = 0
        h["temperature"][first:rows] = 0.0
        h["top_k"][first:rows] = 0
        h["top_p"][first:rows] = 1.0
        h["min_p"][first:rows] = 0.0
        h["penalty"][first:rows] = 1.0

    def _stage(self, scheduled: list[Scheduled]) -> _Staged:
        """Write the step's inputs into the host buffer (not yet sent)."""
        h, bs = self.inputs.host, self.block_size
        ids, positions, slots, cu, kv_lens = [], [], [], [0], []
        rows, sampled, scored, ahead = [], [], [], []
        tables, table_rows = h["tables"], self.inputs.table_rows
        for i, item in enumerate(scheduled):
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_tokens
            table = seq.block_table
            if item.num_tokens == 1:
                ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                ids += seq.token_ids[start:end]
                p = np.arange(start, end)
                positions.append(p)
                slots.append(np.asarray(table)[p // bs] * bs + p % bs)
            if seq.params.prompt_logprobs is not None:
                scored.append((item, cu[-1]))
            cu.append(cu[-1] + item.num_tokens)
            kv_lens.append(end)
            if table_rows[i] != (seq.seq_id, len(table)):
                tables[i, :len(table)] = table
                table_rows[i] = (seq.seq_id, len(table))
            if end == len(seq.token_ids):   # the step reaches the last token: it samples
                rows.append(cu[-1] - 1)
                sampled.append(seq)
                if seq.token_ids[-1] == PENDING:   # sampled by the step in flight
                    ahead.append((cu[-1] - 1, self._ahead_rows[seq]))
                    ids[cu[-1] - 1] = 0
        t, s = cu[-1], len(scheduled)
        h["ids"][:t] = ids
        h["ahead"][:t] = False
        if ahead:
            at, ahead_rows = zip(*ahead)
            h["ahead"][list(at)] = True
            h["ahead_row"][list(at)] = ahead_rows
        h["positions"][:t] = np.hstack(positions) if len(positions) != t else positions
        h["slots"][:t] = np.hstack(slots) if len(slots) != t else slots
        h["cu_seqlens"][:s + 1] = cu
        h["kv_lens"][:s] = kv_lens
        n = len(rows)
        p = [seq.params for seq in sampled]
        h["rows"][:n] = rows
        h["seeds"][:n] = [x.seed for x in p]
        h["steps"][:n] = [len(seq.token_ids) - seq.num_prompt_tokens for seq in sampled]
        h["temperature"][:n] = [x.temperature for x in p]
        h["top_k"][:n] = [x.top_k for x in p]
        h["top_p"][:n] = [x.top_p for x in p]
        h["min_p"][:n] = [x.min_p for x in p]
        h["penalty"][:n] = [x.repetition_penalty for x in p]
        vocab = self.model.cfg.vocab_size
        masks = [seq.mask for seq in sampled if seq.mask is not None]
        floored = any(x.min_p > 0 for x in p)
        return _Staged(t, s, sampled, max(item.num_tokens for item in scheduled), max(kv_lens),
                       # Known here from the requests' parameters, without a device sync.
                       filtered=any(row_filters(x.temperature, x.top_k, x.top_p, vocab) for x in p),
                       logprobs=any(x.logprobs is not None for x in p), scored=scored, masked=bool(masks) or floored,
                       follows_tokens=any(mask.follows_tokens for mask in masks))

    # ---- the forward pass ----------------------------------------------------------

    def _token_ids(self, tokens: int) -> torch.Tensor:
        """The step's input tokens, those still being sampled when it was staged taken from `sampled`."""
        d = self.inputs.dev
        return torch.where(d["ahead"][:tokens], self.sampled.index_select(0, d["ahead_row"][:tokens]),
                           d["ids"][:tokens])

    def _forward(self, seqs: int, tokens: int, max_q_len: int, max_kv_len: int) -> None:
        d = self.inputs.dev
        batch = AttentionBatch(d["slots"][:tokens], d["tables"][:seqs], d["cu_seqlens"][:seqs + 1],
                               d["kv_lens"][:seqs], max_q_len=max_q_len, max_kv_len=max_kv_len)
        self.hidden[:tokens].copy_(self.model.forward(self._token_ids(tokens), d["positions"][:tokens],
                                                      self.kv_caches, batch))

    def _forward_graph(self, staged: _Staged) -> tuple[int, int] | None:
        """(padded batch, KV bound) of the decode graph that serves this step, if one does."""
        size = next((s for s in self.graph_sizes if s >= staged.seqs), None)
        if not self.forward_graphs or staged.max_q_len != 1 or size is None:
            return None
        return size, next(x for x in self.graph_bounds if x >= staged.max_kv_len)

    def _prefill_graph(self, staged: _Staged) -> int | None:
        """The padded token count of the prefill graph that serves this step, if one does."""
        if staged.max_q_len == 1 or not self.prefill_graphs:
            return None
        return next((t for t in self.graph_tokens if t >= staged.tokens), None)

    def _head_graph(self, staged: _Staged) -> tuple[int, bool, bool] | None:
        n = len(staged.sampled)
        key = (next((s for s in self.graph_sizes if s >= n), 0), staged.filtered, staged.logprobs)
        return key if n and key in self.head_graphs else None

    # ---- logits, sampling, logprobs ------------------------------------------------

    def _head(self, n: int, filtered: bool, logprobs: bool, masked: bool = False):
        """Tokens of hidden rows `rows[:n]`; with logprobs, each token's and the top TOP_LOGPROBS.
        masked: the rows' token masks (`masks`) apply first; logprobs are then of the masked
        distribution, the one the token was drawn from."""
        d = self.inputs.dev
        logits = self.model.logits(self.hidden.index_select(0, d["rows"][:n]))
        if masked:   # the rows' masks (all ones for a free row), penalties (1: none), min_p's floors (0: none)
            logits = kernels.apply_token_mask(logits, self.masks[:n])
            logits = kernels.apply_repetition_penalty(logits, self.seen[:n], d["penalty"][:n])
            logits = kernels.apply_min_p(logits, d["min_p"][:n], d["temperature"][:n])
        tokens = kernels.sample(logits, d["seeds"][:n], d["steps"][:n], d["temperature"][:n], d["top_k"][:n],
                                d["top_p"][:n], filtered=filtered)
        self.sampled[:n].copy_(tokens)
        if not logprobs:
            return (tokens,)
        lp = self._log_probs(logits)
        top_lp, top_ids = torch.topk(lp, min(TOP_LOGPROBS, lp.shape[-1]), dim=-1)
        return tokens, lp.gather(1, tokens.unsqueeze(1)).squeeze(1), top_lp, top_ids

    @staticmethod
    def _log_probs(logits: torch.Tensor) -> torch.Tensor:
        """From the fp32 upcast (log_softmax gives other bits from bf16), the one path of a sampled
        token's logprob and a scored one's: scoring equals sampling by construction."""
        return kernels.log_softmax(logits.float())

    def _samples(self, staged: _Staged, host: list[torch.Tensor]) -> list[Sample]:
        """Samples from the outputs as they landed on the host."""
        tokens = host[0].tolist()
        if not staged.logprobs:
            return [Sample(t) for t in tokens]
        chosen, top_lp, top_ids = (x.tolist() for x in host[1:])
        out = []
        for i, (seq, t) in enumerate(zip(staged.sampled, tokens)):
            k = seq.params.logprobs
            top = () if k is None else tuple(zip(top_ids[i][:k], top_lp[i][:k]))
            if seq.mask is not None or seq.params.min_p > 0:   # tokens ruled out are no alternatives (nor JSON)
                top = tuple(e for e in top if e[1] != float("-inf"))
            out.append(Sample(t) if k is None else Sample(t, chosen[i], top))
        return out

    def _wait(self, marks: list | None) -> dict[str, float]:
        """Wait for the GPU (which also keeps the slot's host buffers from being rewritten under a
        copy still queued); the GPU time of the step's phases."""
        if marks is None:
            return {}
        marks[2].synchronize()   # releases the GIL while the GPU works: the HTTP side runs meanwhile
        start, forward, end = marks
        return {"forward": start.elapsed_time(forward) / 1e3, "sampler": forward.elapsed_time(end) / 1e3}

    def _prompt_logprobs(self, staged: _Staged) -> dict[int, list[Sample]]:
        """Logprobs of the prompt tokens whose preceding position this step computed, for the
        sequences that ask; positions scored before a preemption are not scored again."""
        out = {}
        for item, first in staged.scored:
            seq = item.seq
            start, k = seq.num_computed_tokens, seq.params.prompt_logprobs
            lo = max(start, len(seq.prompt_logprobs))            # position p scores token p + 1
            hi = min(start + item.num_tokens, seq.num_prompt_tokens - 1)
            if hi <= lo:
                continue
            lp = self._log_probs(self.model.logits(self.hidden[first + lo - start:first + hi - start]))
            targets = torch.tensor(seq.token_ids[lo + 1:hi + 1], device=self.device).unsqueeze(1)
            chosen = lp.gather(1, targets)
            rank = (lp > chosen).sum(dim=1) + 1
            top_lp, top_ids = torch.topk(lp, max(k, 1), dim=-1)
            chosen, rank, top_lp, top_ids = (x.tolist() for x in (chosen.squeeze(1), rank, top_lp, top_ids))
            out[seq.seq_id] = [Sample(t, c, tuple(zip(ids[:k], lps[:k])), r) for t, c, r, ids, lps in
                               zip(seq.token_ids[lo + 1:hi + 1], chosen, rank, top_ids, top_lp)]
        return out

    @torch.inference_mode()
    def launch(self, scheduled: list[Scheduled], launched: Callable[[], None] = lambda: None) -> Launched:
        """Queue one step on the GPU; finish() reads its tokens. At most two steps are in flight:
        the engine stages and queues step k+1 while step k runs, its tokens that step k is still
        sampling taken on the GPU (_token_ids).

        `launched` is called once, when the step's work is queued as far as the host can queue
        it without waiting: the engine hands the tokens read so far to the HTTP side then, which
        works while the GPU does, and may wait there for the handlers (outbox.py) without
        leaving the GPU idle."""
        slot = self._slot
        if self._in_flight[slot]:
            raise RuntimeError("two steps are already in flight")
        self._slot = 1 - slot
        self.inputs.use(slot)
        outputs_host, marks = self.slots[slot]
        staged = self._stage(scheduled)
        self._ahead_rows = {seq: j for j, seq in enumerate(staged.sampled)}
        forward, prefill = self._forward_graph(staged), self._prefill_graph(staged)
        head = None if staged.masked else self._head_graph(staged)   # masked heads run eagerly
        if forward:
            self._pad(staged.seqs, forward[0], staged.tokens, forward[0])
        if prefill:
            self._pad_prefill(staged.seqs, staged.tokens, prefill)
        if head:
            self._pad_rows(len(staged.sampled), head[0])
        self.inputs.upload(forward[0] if forward else self.max_seqs if prefill else staged.seqs)
        self._in_flight[slot] = True
        if marks:
            marks[0].record(self.stream)
        graph = self.forward_graphs[forward] if forward else self.prefill_graphs[prefill] if prefill else None
        # The hand-over goes before the step's first eager part (eager launches are host work),
        # else after the last graph.
        if graph is None:
            launched()
            self._forward(staged.seqs, staged.tokens, staged.max_q_len, staged.max_kv_len)
        else:
            graph.replay()
        if marks:
            marks[1].record(self.stream)
        if graph is not None and not head:
            launched()
        if staged.masked:
            # Filled while the GPU runs the forward pass, which does not need them.
            n = len(staged.sampled)
            fill_rows(self.masks_host[slot].numpy(), staged.sampled)
            self.masks[:n].copy_(self.masks_host[slot][:n], non_blocking=True)
            fill_seen(self.seen_host[slot].numpy(), staged.sampled)
            self.seen[:n].copy_(self.seen_host[slot][:n], non_blocking=True)
        outputs = ()
        if head:
            head_graph, outputs = self.head_graphs[head]
            head_graph.replay()
        elif staged.sampled:
            outputs = self._head(len(staged.sampled), staged.filtered, staged.logprobs, staged.masked)
        n = len(staged.sampled)
        for name, out in zip(OUTPUTS, outputs):
            outputs_host[name][:n].copy_(out[:n], non_blocking=True)
        if marks:
            marks[2].record(self.stream)
        if graph is not None and head:
            launched()
        return Launched(staged, slot, self._prompt_logprobs(staged))

    def finish(self, step: Launched) -> StepOutput:
        """Wait for a launched step and read its tokens."""
        outputs_host, marks = self.slots[step.slot]
        gpu_seconds = self._wait(marks)
        self._in_flight[step.slot] = False
        n = len(step.staged.sampled)
        host = [outputs_host[name][:n] for name in OUTPUTS[:len(OUTPUTS) if step.staged.logprobs else 1]]
        return StepOutput(step.staged.sampled, self._samples(step.staged, host) if n else [], gpu_seconds)

    def drain(self) -> None:
        """Forget the steps in flight, once the GPU is done with them (after a failed step)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._in_flight = [False, False]
        self._ahead_rows = {}

    # ---- CUDA graphs ---------------------------------------------------------------

    def _capture(self) -> None:
        n = max(self.graph_sizes)
        self._pad(0, n, 0, n)
        self._pad_rows(0, n)
        self.inputs.upload(n)
        pool = None
        for bound in sorted(self.graph_bounds, reverse=True):
            for b in sorted(self.graph_sizes, reverse=True):
                graph, _ = self._graph(lambda: self._forward(b, b, 1, bound), pool)
                pool = graph.pool()
                self.forward_graphs[b, bound] = graph
        # Standard mode keeps prefill and sampling eager (the module's docstring says why).
        if kernels.get_mode() == "invariant":
            for t in sorted(self.graph_tokens, reverse=True):
                self._pad_prefill(0, 0, t)
                self.inputs.upload(self.max_seqs)
                self.prefill_graphs[t], _ = self._graph(
                    lambda: self._forward(self.max_seqs, t, self.chunk_size, self.max_model_len), pool)
            for b in sorted(self.graph_sizes, reverse=True):
                for filtered, logprobs in itertools.product((False, True), repeat=2):
                    self.head_graphs[b, filtered, logprobs] = self._graph(lambda: self._head(b, filtered, logprobs), pool)
        torch.cuda.synchronize()
        log.info("captured %d decode CUDA graphs (batch sizes %s x KV bounds %s), %d prefill graphs (tokens %s) "
                 "and %d sampler graphs", len(self.forward_graphs), self.graph_sizes, self.graph_bounds,
                 len(self.prefill_graphs), sorted(self.prefill_graphs), len(self.head_graphs))

    @staticmethod
    def _graph(run, pool) -> tuple[torch.cuda.CUDAGraph, object]:
        """A CUDA graph of run() and what the captured call returned; an eager call first compiles
        the kernels outside capture."""
        run()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = run()
        return graph, out
