"""The engine loop: it owns the model, the KV cache and the scheduler.

It runs on a thread (engine_thread.py) or in a process of its own (engine_process.py); either
way the HTTP side talks to it only through commands (add a request, abort one, stop) and
the lots it sends back (outbox.py: each sampled token as an Event, the last one carrying the
finish reason, and each step's numbers for the metrics).

The loop keeps the GPU a step ahead of the host: it schedules and queues step k+1 while step
k runs, and only then reads step k's tokens. A sequence's token from step k is PENDING in its
token list until then, and step k+1 takes it on the GPU. What the host cannot know yet costs
little: a sequence that step k ends with end-of-sequence computes one more token, which is
dropped; one that ends by length is not scheduled again (Sequence.last_in_flight). A row's
bits do not depend on which step or batch computed it, so this changes no output.
With --audit-rate R, a fraction R of finished requests
is later re-run when the engine is idle, alone and cold, and the tokens compared with
what was served.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import logging
import queue
import random
import sys
import time
from pathlib import Path

import torch

import kernels
from kernels.attention_triton import attention_layout_problem
from local_backend.config import EngineConfig, ModelConfig, settings_digest
from local_backend.engine.block_manager import BlockManager
from local_backend.engine.messages import EngineInfo, Event, StepStats
from local_backend.engine.model_runner import Launched, ModelRunner
from local_backend.engine.outbox import Outbox
from local_backend.engine.row_mask import RowMask
from local_backend.engine.scheduler import Scheduled, Scheduler
from local_backend.engine.sequence import PENDING, Sequence, Status
from local_backend.errors import CheckpointError
from local_backend.grammar import Grammars
from local_backend.loader import load_weights
from local_backend.models.qwen3_moe import model_class
from local_backend.sampling_params import SamplingParams
from local_backend.tokenizer import Tokenizer

log = logging.getLogger(__name__)

ACTIVATION_RESERVE_BYTES = 4 << 30   # prefill activations, logits, CUDA graphs
# How long a thread may hold the GIL while another waits for it. The engine thread gives it
# up on every GPU wait; at Python's default 5 ms, another thread of its process (the HTTP
# handlers, when the engine is a thread of the server) then idles the GPU for up to that
# long each step.
GIL_SWITCH_SECONDS = 0.0002


@dataclasses.dataclass
class _InFlight:
    """A step queued on the GPU, and what reading it needs from when it was launched."""
    scheduled: list[Scheduled]
    run: Launched
    at: list[int | None]   # where each sampled sequence's PENDING token sits (None: a scored prompt)


@dataclasses.dataclass
class _Audit:
    prompt: list[int]
    params: SamplingParams
    served: list[int]


def device_arch(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def fingerprint(weights_digest: str, settings_digest: str, mode: str, dtype: torch.dtype, arch: str,
                toolchain: str, chunk_size: int) -> str:
    # Everything that fixes the bits: the same kernels built by another Triton sum in another order;
    # the settings files (config, generation defaults, tokenizer, template) change what is computed;
    # the reference kernels of the CPU path sum a prompt differently when it is cut elsewhere.
    parts = "|".join([weights_digest, settings_digest, kernels.KERNEL_VERSION, mode, str(dtype), arch, toolchain,
                      f"chunk {chunk_size}"])
    return "fp_" + hashlib.blake2b(parts.encode(), digest_size=8).hexdigest()


def kv_block_count(config: EngineConfig, cfg: ModelConfig, max_model_len: int, device: torch.device,
                   dtype: torch.dtype) -> int:
    per_seq = -(-max_model_len // config.block_size)
    if config.kv_blocks:
        return config.kv_blocks
    if device.type != "cuda":
        return 4 * per_seq
    block_bytes = 2 * cfg.num_layers * config.block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize
    free, _ = torch.cuda.mem_get_info(device)
    return max(per_seq, int((free * config.gpu_memory_fraction - ACTIVATION_RESERVE_BYTES) // block_bytes))


def serving_length(config: EngineConfig, cfg: ModelConfig) -> int:
    """The context served: the checkpoint's own unless asked for less; more is refused, since
    positions past what the model was trained on give text no error would flag."""
    if config.max_model_len is None:
        return cfg.max_position_embeddings
    if config.max_model_len > cfg.max_position_embeddings:
        raise CheckpointError(f"{Path(config.model) / 'config.json'}: max_position_embeddings is "
                              f"{cfg.max_position_embeddings}, less than the --max-model-len {config.max_model_len} "
                              f"asked for")
    return config.max_model_len


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        gpu = self.device.type == "cuda"
        # Without a GPU the torch reference kernels serve one request at a time. They are
        # not batch-invariant (a BLAS may sum a row differently for another M), so a
        # prompt served partly from the prefix cache could differ in its last bits from a
        # cold one: the CPU path leaves the prefix cache off unless asked, and every
        # request then runs through exactly the same steps.
        self.max_batch = config.max_batch if gpu else 1
        self.prefix_caching = gpu if config.prefix_caching is None else config.prefix_caching
        kernels.set_mode(config.mode)
        self.model_config = cfg = ModelConfig.from_dir(config.model)
        self.tokenizer = Tokenizer(config.model, config.chat_template)
        self.tokenizer.check_vocab(cfg.vocab_size)
        if config.mode == "invariant" and gpu:
            problem = attention_layout_problem(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
            if problem:
                raise CheckpointError(f"{Path(config.model) / 'config.json'}: {problem}")
        eos = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.max_model_len = serving_length(config, cfg)
        weights, digest = load_weights(config.model, cfg, str(self.device), self.dtype)
        self.toolchain = kernels.toolchain(self.device)
        self.fingerprint = fingerprint(digest, settings_digest(config.model, config.chat_template), config.mode, self.dtype,
                                       device_arch(self.device), self.toolchain, config.chunk_size)
        model = model_class(cfg)(cfg, weights, self.max_model_len)
        self.num_blocks = kv_block_count(config, cfg, self.max_model_len, self.device, self.dtype)
        self.runner = ModelRunner(model, self.num_blocks, config.block_size, self.max_model_len,
                                  config.max_batch, config.max_batched_tokens, config.chunk_size, config.cuda_graphs)
        self.blocks = BlockManager(self.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.blocks, self.max_batch, config.max_batched_tokens, config.chunk_size)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._seqs: dict[int, Sequence] = {}
        self._requests: dict[int, Sequence] = {}   # by the HTTP side's request id
        # The engine's own numbering: a sequence id is never reused (the runner keys cached
        # block-table rows by it), while request ids restart with each HTTP side.
        self._ids = itertools.count()
        self._audits: collections.deque[_Audit] = collections.deque(maxlen=256)
        self._audit_rng = random.Random()
        self._auditing: dict[int, _Audit] = {}
        self.outbox = Outbox()
        self._in_flight: _InFlight | None = None
        self._clock = 0.0   # when the last step's tokens were read: a step's wall time runs from there
        # The prefix cache's lookups and hits, and the outbox's wait, when the last StepStats
        # was written: each StepStats carries what accrued since (the metrics only sum them).
        self._counted = (0, 0, 0.0)
        self._grammars: Grammars | None = None

    @property
    def grammars(self) -> Grammars:
        """Compiled grammars of constrained requests, built at the first (the tokenizer's index
        takes a while to build)."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer.tok.to_str(), self.model_config.vocab_size,
                                      sorted(self.eos_token_ids))
        return self._grammars

    def _mask(self, params: SamplingParams) -> RowMask | None:
        if not RowMask.wanted(params):
            return None
        return RowMask(params, self.eos_token_ids, self.grammars if params.grammar is not None else None)

    def info(self) -> EngineInfo:
        return EngineInfo(self.fingerprint, kernels.KERNEL_VERSION, self.toolchain, str(self.device),
                          str(self.dtype).removeprefix("torch."), self.num_blocks, self.config.block_size,
                          self.max_model_len, self.max_batch, self.prefix_caching)

    def command(self, command: tuple) -> None:
        """("add", request_id, prompt, params) | ("abort", request_id) | ("stop",); safe from any thread."""
        self._inbox.put(command)

    # ---- driven directly, on the calling thread ------------------------------------------

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """The first n greedy tokens after `prompt`, end-of-sequence ignored: the model path
        alone (scheduler, paged KV cache, runner, sampler), without HTTP or the engine loop,
        which must not be running. For tests and benchmarks."""
        params = SamplingParams(seed=0, max_tokens=n, temperature=0.0, ignore_eos=True)
        seq = Sequence(next(self._ids), list(prompt), len(prompt), params, use_prefix_cache=False)
        self.scheduler.add(seq)
        while seq.num_generated < n:
            self._collect(self._launch(self.scheduler.schedule()))
        self.scheduler.remove(seq)
        return seq.token_ids[seq.num_prompt_tokens:]

    # ---- the loop --------------------------------------------------------------------

    def run(self, deliver) -> None:
        """Serve commands until ("stop",), sending lots to `deliver`."""
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        for seq in list(self._requests.values()):   # left by an HTTP side before this one: nobody waits
            self._finish(seq, audit=False)
        self.outbox.connect(deliver)
        while True:
            block = not self.scheduler.has_work() and not self._audits and self._in_flight is None
            if block:
                self.outbox.send()
            try:
                while True:
                    command = self._inbox.get(block=block)
                    block = False
                    if command[0] == "stop":
                        if self._in_flight:
                            self._collect(self._in_flight)
                        self.outbox.send()
                        return
                    self._command(command)
            except queue.Empty:
                pass
            if not self.scheduler.has_work() and self._audits and self._in_flight is None:
                self._start_audit(self._audits.popleft())
            if self.scheduler.has_work() or self._in_flight:
                self._step()

    def _command(self, command: tuple) -> None:
        if command[0] == "add":
            _, request_id, prompt, params = command
            # Prompt logprobs need every prompt position computed, none served from the cache.
            seq = Sequence(next(self._ids), list(prompt), len(prompt), params, request_id=request_id,
                           use_prefix_cache=self.prefix_caching and params.prompt_logprobs is None,
                           mask=self._mask(params))
            self._seqs[seq.seq_id] = self._requests[request_id] = seq
            self.scheduler.add(seq)
        elif command[0] == "abort" and command[1] in self._requests:
            self._finish(self._requests[command[1]])

    def _start_audit(self, audit: _Audit) -> None:
        seq_id = next(self._ids)
        params = dataclasses.replace(audit.params, max_tokens=len(audit.served), ignore_eos=True,
                                     prompt_logprobs=None)
        seq = Sequence(seq_id, list(audit.prompt), len(audit.prompt), params, use_prefix_cache=False, alone=True,
                       mask=self._mask(params))
        self._seqs[seq_id] = seq
        self._auditing[seq_id] = audit
        self.scheduler.add(seq)

    def _step(self) -> None:
        """Queue the next step, then read the one before it (if any)."""
        if self._in_flight is None:
            self._clock = time.perf_counter()
        previous, self._in_flight = self._in_flight, None
        try:
            if previous and previous.run.staged.follows_tokens:
                # A grammar's mask needs the token before it: this step is not staged ahead.
                self._collect(previous)
                previous = None
            scheduled = self.scheduler.schedule()
            launched = self._launch(scheduled) if scheduled else None
            if previous:
                self._collect(previous)
            self._in_flight = launched
        except Exception as e:  # a failed step fails its requests, not the server
            log.exception("engine step failed")
            self.runner.drain()
            self.outbox.lot.error = f"{type(e).__name__}: {e}"
            for seq in list(self._seqs.values()):
                self._emit(seq, Event(error="the inference step failed; see the backend log"))
                self._finish(seq, audit=False)
            self.outbox.send()
            return
        if not scheduled:   # no launch to hand the tokens over at
            self.outbox.send()

    def _ends_by_length(self, seq: Sequence, tokens: int) -> bool:
        return tokens - seq.num_prompt_tokens >= seq.params.max_tokens or tokens >= self.max_model_len

    def _launch(self, scheduled: list[Scheduled]) -> _InFlight:
        """Queue a step and count its tokens as computed; each sampled sequence gets a PENDING token."""
        run = self.runner.launch(scheduled, self.outbox.send)
        self.scheduler.advance(scheduled)
        for seq_id, entries in run.prompt_logprobs.items():
            self._seqs[seq_id].prompt_logprobs += entries
        at = []
        for seq in run.staged.sampled:
            if seq.params.max_tokens == 0:   # scored, not generated: the draw will be dropped
                seq.last_in_flight = True
                at.append(None)
            else:
                at.append(len(seq))
                seq.token_ids.append(PENDING)
                seq.last_in_flight = self._ends_by_length(seq, len(seq))
        return _InFlight(scheduled, run, at)

    def _collect(self, step: _InFlight) -> None:
        """Read a step's tokens into its sequences, emit them, and end the sequences they end."""
        output = self.runner.finish(step.run)
        ended, generated = [], 0
        for seq, sample, at in zip(output.sampled, output.samples, step.at):
            if seq.status is Status.FINISHED:   # aborted, or ended by the step before, while this one ran
                continue
            reason = None
            if at is None:
                sample, reason = None, "length"
            else:
                seq.token_ids[at] = sample.token
                generated += 1
                if sample.token in self.eos_token_ids and not seq.params.ignore_eos:
                    reason = "stop"
                elif seq.mask is not None and not seq.mask.consume(sample.token):
                    reason = "stop"   # the grammar is complete: nothing may follow
                elif self._ends_by_length(seq, at + 1):
                    reason = "length"
            first = at is None or at == seq.num_prompt_tokens
            prompt = seq.prompt_logprobs if seq.params.prompt_logprobs is not None and first else None
            self._emit(seq, Event(sample, reason, prompt_logprobs=prompt))
            if reason:
                ended.append(seq)
        self.scheduler.register(step.scheduled)
        for seq in ended:
            self._finish(seq)
        now, counted = time.perf_counter(), (self.blocks.queries, self.blocks.hits, self.outbox.waited)
        queries, hits, waited = (x - y for x, y in zip(counted, self._counted))
        self.outbox.lot.steps.append(StepStats(
            len(step.scheduled), generated, now - self._clock, self.blocks.num_used, len(self.scheduler.waiting),
            queries, hits, output.gpu_seconds, waited))
        self._clock, self._counted = now, counted

    def _emit(self, seq: Sequence, event: Event) -> None:
        """Hold an event for its request, in order; the outbox sends it."""
        if seq.request_id is not None:
            self.outbox.lot.events.append((seq.request_id, event))

    def _finish(self, seq: Sequence, audit: bool = True) -> None:
        seq.drop_pending()
        self.scheduler.remove(seq)
        self._seqs.pop(seq.seq_id, None)
        self._requests.pop(seq.request_id, None)
        if seq.seq_id in self._auditing:
            served = self._auditing.pop(seq.seq_id).served
            if audit:
                result = "match" if seq.token_ids[seq.num_prompt_tokens:] == served else "mismatch"
                if result == "mismatch":
                    log.error("determinism audit mismatch (seed %d)", seq.params.seed)
                self.outbox.lot.audits.append(result)
        elif audit and seq.num_generated and self._audit_rng.random() < self.config.audit_rate:
            self._audits.append(_Audit(seq.token_ids[:seq.num_prompt_tokens], seq.params,
                                       seq.token_ids[seq.num_prompt_tokens:]))
