"""The engine as the HTTP side sees it: what it serves, the tokenizer, the metrics, and one
mailbox of events per request, fed by the engine's lots.

The engine itself sits behind a link: a thread of this process (engine_thread.py: tests,
which reach into it, and benchmarks that drive it) or a process of its own
(engine_process.py: the server), where its loop shares no interpreter with the handlers.
A link has `config`, `info` and `alive`, and start(loop, deliver, died), send(command),
was_read() and stop().
"""
from __future__ import annotations

import asyncio
import itertools

from local_backend.config import EngineConfig, ModelConfig
from local_backend.engine.messages import Event, Lot
from local_backend.grammar import Grammars
from local_backend.metrics import Metrics
from local_backend.protocol import APIError
from local_backend.sampling_params import SamplingParams
from local_backend.tokenizer import Tokenizer


class Mailbox:
    """One request's events as the lots bring them. Its handler takes what has arrived all at
    once, and is woken only once `batch` events or the last one are in: a request answered in
    one body reads its tokens in batches, since per-token wake-ups were most of the HTTP side's
    work per token besides detokenizing (`bench/results/backend_http_side.md`)."""

    def __init__(self, batch: int = 1):
        self._events: list[Event] = []
        self._batch = batch
        self._last = False
        self._waiter: asyncio.Future | None = None

    def put(self, event: Event) -> None:
        self._events.append(event)
        self._last = bool(event.finish_reason or event.error)
        if self._waiter is not None and not self._waiter.done() and self._ready():
            self._waiter.set_result(None)

    def _ready(self) -> bool:
        return self._last or len(self._events) >= self._batch

    async def take(self) -> list[Event]:
        while not self._ready():
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        events, self._events = self._events, []
        return events


class EngineClient:
    def __init__(self, link, metrics: Metrics):
        self.link, self.metrics = link, metrics
        self.config: EngineConfig = link.config
        self.info = link.info
        self.model_config = ModelConfig.from_dir(self.config.model)
        self.tokenizer = Tokenizer(self.config.model, self.config.chat_template)
        self.last_error: str | None = None
        self._grammars = None
        self._mailboxes: dict[int, Mailbox] = {}
        self._ids = itertools.count()
        self._running = False
        metrics.kv_blocks_total.set(self.info.num_blocks)

    def grammar_checked(self, grammar_text: str) -> str:
        """The grammar, once it compiled here (a GrammarError names what is wrong): the engine
        then never meets one it cannot compile."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer.tok.to_str(), self.model_config.vocab_size,
                                      sorted(self.eos_token_ids))
        self._grammars.compiled(grammar_text)
        return grammar_text

    @property
    def eos_token_ids(self) -> frozenset[int]:
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        return frozenset(eos)

    @property
    def alive(self) -> bool:
        return self._running and self.link.alive

    def start(self) -> None:
        """Called on the event loop that will run the handlers."""
        self._running = True
        self.link.start(asyncio.get_running_loop(), self._deliver, self._died)

    def stop(self) -> None:
        self._running = False
        self.link.stop()

    def submit(self, prompt: list[int], params: SamplingParams, batch: int = 1) -> tuple[int, Mailbox]:
        if not self.alive:
            raise APIError(503, "the engine is not running; see the backend log", type="server_error")
        request_id, mailbox = next(self._ids), Mailbox(batch)
        self._mailboxes[request_id] = mailbox
        self.metrics.prompt_tokens.inc(len(prompt))
        self.link.send(("add", request_id, prompt, params))
        return request_id, mailbox

    def abort(self, request_id: int) -> None:
        if self._mailboxes.pop(request_id, None) is not None and self.alive:
            self.link.send(("abort", request_id))

    def _deliver(self, lot: Lot) -> None:
        for request_id, event in lot.events:
            mailbox = self._mailboxes.get(request_id)
            if mailbox is not None:
                mailbox.put(event)
                if event.finish_reason or event.error:
                    del self._mailboxes[request_id]
        m = self.metrics
        for step in lot.steps:
            m.generation_tokens.inc(step.generated)
            m.batch_size.observe(step.sequences)
            m.kv_blocks_used.set(step.kv_blocks_used)
            m.queue_depth.set(step.queue_depth)
            m.prefix_queries.inc(step.prefix_queries)
            m.prefix_hits.inc(step.prefix_hits)
            m.step_duration.observe(step.seconds)
            for phase, seconds in step.gpu_seconds.items():
                m.step_gpu_phase[phase].inc(seconds)
            m.step_handoff_wait.inc(step.handoff_wait)
        for result in lot.audits:
            m.audit.labels(result=result).inc()
        self.last_error = lot.error or self.last_error
        # Behind the handlers this lot woke, each of which runs until it waits for its next events.
        asyncio.get_running_loop().call_soon(self.link.was_read)

    def _died(self, reason: str) -> None:
        """The engine is gone: every request still waiting ends with a server error, not a hang."""
        self._running = False
        self.last_error = reason
        for mailbox in self._mailboxes.values():
            mailbox.put(Event(error=f"{reason}; see the backend log"))
        self._mailboxes.clear()
