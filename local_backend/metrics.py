"""The backend's Prometheus metrics. Names are a contract with the dashboards in deploy/."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """One set per server, on its own registry, so several servers can live in one process."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("detgate_backend_requests", "Finished requests by HTTP status", ["status"], registry=r)
        self.prompt_tokens = Counter("detgate_backend_prompt_tokens", "Prompt tokens admitted", registry=r)
        self.generation_tokens = Counter("detgate_backend_generation_tokens", "Tokens generated", registry=r)
        self.batch_size = Histogram("detgate_backend_batch_size", "Sequences per engine step",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.kv_blocks_used = Gauge("detgate_backend_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_blocks_total = Gauge("detgate_backend_kv_blocks_total", "KV cache blocks", registry=r)
        self.queue_depth = Gauge("detgate_backend_queue_depth", "Requests waiting for admission", registry=r)
        self.prefix_queries = Counter("detgate_backend_prefix_cache_queries",
                                      "Full prompt blocks looked up in the prefix cache", registry=r)
        self.prefix_hits = Counter("detgate_backend_prefix_cache_hits",
                                   "Full prompt blocks served from the prefix cache", registry=r)
        self.step_duration = Histogram("detgate_backend_step_duration_seconds", "Engine step wall time",
                                       buckets=STEP_BUCKETS, registry=r)
        self.step_gpu = Counter("detgate_backend_step_gpu_seconds",
                                "GPU time of engine steps by phase (forward, sampler: logits and sampling)",
                                ["phase"], registry=r)
        # Exported from the start (without a GPU they stay 0), and looked up once, not every step.
        self.step_gpu_phase = {phase: self.step_gpu.labels(phase=phase) for phase in ("forward", "sampler")}
        self.step_handoff_wait = Counter(
            "detgate_backend_step_handoff_wait_seconds",
            "Time engine steps waited for the HTTP side to read the previous step's tokens", registry=r)
        self.audit = Counter("detgate_backend_audit", "Determinism audits: a served request re-run alone and cold",
                             ["result"], registry=r)
