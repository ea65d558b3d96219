"""The metrics the dashboards and alerts may refer to: the names and labels the gateway and
the backend promised to export. A query naming anything else points at nothing."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Metric:
    kind: str  # "counter" | "gauge" | "histogram"
    labels: tuple[str, ...] = ()

    def series(self, name: str) -> tuple[str, ...]:
        """The series names a query can use for this metric."""
        if self.kind == "histogram":
            return (f"{name}_bucket", f"{name}_sum", f"{name}_count")
        return (name,)


# Everything the gateway exports; under the live stack's load each one has data.
GATEWAY = {
    # Issue 2: traffic, cache and upstreams.
    "detgate_requests_total": Metric("counter", ("route", "model", "cache", "code")),
    "detgate_request_duration_seconds": Metric("histogram", ("route", "cache")),
    "detgate_upstream_requests_total": Metric("counter", ("upstream", "code")),
    "detgate_upstream_duration_seconds": Metric("histogram", ("upstream",)),
    "detgate_coalesced_total": Metric("counter", ("route",)),
    "detgate_cache_errors_total": Metric("counter", ("op",)),
    "detgate_canonical_rules_total": Metric("counter", ("rule",)),
    "detgate_cache_entries_bytes": Metric("gauge"),
    "detgate_inflight_requests": Metric("gauge"),
    # Issue 5: de-randomization, hidden variables, votes, schema retries, drift and canaries.
    "detgate_param_rewrites_total": Metric("counter", ("param",)),
    "detgate_hidden_variables_total": Metric("counter", ("kind",)),
    "detgate_vote_total": Metric("counter", ("model", "outcome")),
    "detgate_vote_agreement": Metric("histogram"),
    "detgate_schema_attempts_total": Metric("counter", ("model", "result")),
    "detgate_drift_events_total": Metric("counter", ("upstream", "model", "kind")),
    "detgate_canary_status": Metric("gauge", ("canary",)),
    "detgate_canary_runs_total": Metric("counter", ("canary", "result")),
    # Issue 7: reliability, limits and cache integrity.
    "detgate_upstream_retries_total": Metric("counter", ("upstream", "reason")),
    "detgate_upstream_saturated_total": Metric("counter", ("upstream", "why")),
    "detgate_circuit_open": Metric("gauge", ("upstream",)),
    "detgate_rate_limited_total": Metric("counter", ("tenant",)),
    "detgate_cache_bypass_total": Metric("counter", ("reason",)),
    "detgate_refreshes_total": Metric("counter", ("tenant", "control", "outcome")),
    "detgate_cache_tamper_total": Metric("counter"),
    # Issue 22: complete answers the store rules (store_finish) keep out of the cache.
    "detgate_cache_declined_total": Metric("counter", ("finish",)),
    # Issue 43: readiness (/readyz), checked every few seconds.
    "detgate_ready": Metric("gauge"),
    "detgate_store_up": Metric("gauge"),
    "detgate_upstream_usable": Metric("gauge", ("upstream",)),
}

# Issue 4: the whitebox backend.
BACKEND = {
    "detgate_backend_requests_total": Metric("counter", ("status",)),
    "detgate_backend_prompt_tokens_total": Metric("counter"),
    "detgate_backend_generation_tokens_total": Metric("counter"),
    "detgate_backend_batch_size": Metric("histogram"),
    "detgate_backend_kv_blocks_used": Metric("gauge"),
    "detgate_backend_kv_blocks_total": Metric("gauge"),
    "detgate_backend_queue_depth": Metric("gauge"),
    "detgate_backend_prefix_cache_queries_total": Metric("counter"),
    "detgate_backend_prefix_cache_hits_total": Metric("counter"),
    "detgate_backend_step_duration_seconds": Metric("histogram"),
    "detgate_backend_step_gpu_seconds_total": Metric("counter", ("phase",)),
    "detgate_backend_step_handoff_wait_seconds_total": Metric("counter"),
    "detgate_backend_audit_total": Metric("counter", ("result",)),
}

ALL = {**GATEWAY, **BACKEND}

# Labels Prometheus attaches to every scraped series, and the bucket bound of histograms.
TARGET_LABELS = ("job", "instance")
BUCKET_LABEL = "le"
# Series Prometheus makes itself for every target.
SYNTHETIC = {"up": Metric("gauge")}


def series_index(metrics: dict[str, Metric]) -> dict[str, tuple[str, Metric]]:
    """Series name -> (metric name, metric), for resolving what a query names."""
    return {s: (name, m) for name, m in metrics.items() for s in m.series(name)}
