"""The Prometheus metrics, one registry per app so that several apps can share a process.

Names and labels are a contract with the Grafana dashboards in deploy/: change them together.
"""
from __future__ import annotations

from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

CANARY_RESULTS = ("recorded", "match", "mismatch", "error")

# From a cache hit (sub-millisecond) to a long generation.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("detgate_requests", "Requests answered, by cache outcome and HTTP status.",
                                ["route", "model", "cache", "code"], registry=r)
        self.request_duration = Histogram("detgate_request_duration_seconds", "Time to answer a request.",
                                          ["route", "cache"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_requests = Counter("detgate_upstream_requests", "Calls made to upstreams, by status.",
                                         ["upstream", "code"], registry=r)
        self.upstream_duration = Histogram("detgate_upstream_duration_seconds", "Time an upstream call took.",
                                           ["upstream"], buckets=LATENCY_BUCKETS, registry=r)
        self.coalesced = Counter("detgate_coalesced", "Requests answered by an upstream call another request made.",
                                 ["route"], registry=r)
        self.cache_errors = Counter("detgate_cache_errors", "Store operations that failed; the request went on uncached.",
                                    ["op"], registry=r)
        self.live_unstored = Counter("detgate_live_stream_unstored", "Live streams sent as a miss or coalesced "
                                     "whose answer the cache does not hold: its store failed, or another replica's "
                                     "call stored first (its headers had left).", ["route"], registry=r)
        self.canonical_rules = Counter("detgate_canonical_rules", "Canonicalization rules that changed a request.",
                                       ["rule"], registry=r)
        self.cache_entries_bytes = Gauge("detgate_cache_entries_bytes", "Bytes held by the in-process store.", registry=r)
        self.inflight = Gauge("detgate_inflight_requests", "Requests being answered right now.", registry=r)
        # Read when scraped, counted in a plain int: a gauge's inc and dec take a lock each,
        # twice per request on the hit path.
        self.in_flight = 0
        self.inflight.set_function(lambda: self.in_flight)
        # Issue 5: drift and canaries.
        self.drift_events = Counter("detgate_drift_events", "Upstream changes noticed: a new system_fingerprint, "
                                    "or a canary answering differently.", ["upstream", "model", "kind"], registry=r)
        self.canary_status = Gauge("detgate_canary_status", "1 while a canary answers as first recorded, 0 after "
                                   "a mismatch.", ["canary"], registry=r)
        self.canary_runs = Counter("detgate_canary_runs", "Canary probes run, by result (match, mismatch, "
                                   "recorded, error).", ["canary", "result"], registry=r)
        # Issue 7: reliability, limits and cache integrity.
        self.upstream_retries = Counter("detgate_upstream_retries", "Upstream attempts retried, by why they failed.",
                                        ["upstream", "reason"], registry=r)
        self.circuit_open = Gauge("detgate_circuit_open", "1 while an upstream's circuit breaker is open.",
                                  ["upstream"], registry=r)
        self.upstream_saturated = Counter("detgate_upstream_saturated",
                                          "Requests refused for want of a concurrent-call slot to an upstream.",
                                          ["upstream", "why"], registry=r)
        self.rate_limited = Counter("detgate_rate_limited", "Requests refused by a tenant's rate limit.",
                                    ["tenant"], registry=r)
        self.refreshes = Counter("detgate_refreshes", "x-detgate-cache-control no-cache and no-store sent, by "
                                 "tenant and whether its right allowed them.", ["tenant", "control", "outcome"],
                                 registry=r)
        self.cache_bypass = Counter("detgate_cache_bypass", "Requests answered without the cache, by why.",
                                    ["reason"], registry=r)
        self.cache_declined = Counter("detgate_cache_declined", "Complete answers served but not stored, as the "
                                      "store rules (store_finish) decide, by finish class.", ["finish"], registry=r)
        self.cache_tamper = Counter("detgate_cache_tamper",
                                    "Stored entries that failed their MAC check (altered, or copied from another key).",
                                    registry=r)
        # Issue 5: de-randomization, hidden variables, votes and schema-validated retries.
        self.param_rewrites = Counter("detgate_param_rewrites", "Sampling parameters the policy changed or flagged.",
                                      ["param"], registry=r)
        self.hidden_variables = Counter("detgate_hidden_variables", "Prompts (on misses) holding values that change "
                                        "per request: timestamps, dates, UUIDs, request ids.", ["kind"], registry=r)
        self.votes = Counter("detgate_vote", "Majority votes decided, by outcome (majority, plurality, tie_break, "
                             "failed).", ["model", "outcome"], registry=r)
        self.vote_agreement = Histogram("detgate_vote_agreement", "Share of a vote's counted answers that agreed "
                                        "with the winner.", buckets=(0.2, 0.34, 0.4, 0.5, 0.6, 0.67, 0.75, 0.8, 0.9, 1.0),
                                        registry=r)
        self.schema_attempts = Counter("detgate_schema_attempts", "Schema-checked answers, by result: valid or "
                                       "invalid per attempt, exhausted per request whose attempts all failed, "
                                       "streamed_invalid per live stream passed on invalid and not stored.",
                                       ["model", "result"], registry=r)
        # Readiness (gateway/ops/readiness.py), as of the last check (every few seconds, and each /readyz).
        self.ready = Gauge("detgate_ready", "1 while /readyz answers 200: the store usable (or fail-open) and at "
                           "least one upstream usable.", registry=r)
        self.store_up = Gauge("detgate_store_up", "1 while the cache store answers its ping.", registry=r)
        self.upstream_usable = Gauge("detgate_upstream_usable", "1 while an upstream can be called: its circuit "
                                     "is not open and its key, where it needs one, is set.", ["upstream"], registry=r)
        # The operator's cache API (gateway/ops/cache_api.py).
        self.cache_admin = Counter("detgate_cache_admin", "Operator cache API calls, by operation (list, show, "
                                   "delete, delete_matching).", ["op"], registry=r)
        self.cache_admin_deleted = Counter("detgate_cache_admin_deleted", "Cache entries the operator deleted, by "
                                           "how they were chosen (key, filter).", ["by"], registry=r)
        self._children: dict[tuple[str, str, str, str], tuple[Counter, Histogram]] = {}
        self._labelled: dict[tuple[Counter, str], Counter] = {}

    def prime(self, upstreams: Iterable[str], canaries: Iterable[str], limited_tenants: Iterable[str],
              tenants: Iterable[tuple[str, bool]] = ()) -> None:
        """Create the series we know will exist at zero. A series born at 1 shows no increase
        to rate() or increase(), so without this the first breaker trip, canary mismatch or
        rate-limit refusal would be invisible to dashboards and alerts."""
        for upstream in upstreams:
            self.circuit_open.labels(upstream).set(0)
        for canary in canaries:
            for result in CANARY_RESULTS:
                self.canary_runs.labels(canary, result)
        for tenant in limited_tenants:
            self.rate_limited.labels(tenant)
        for tenant, refresh in tenants:  # (name, whether it has the refresh right)
            for control in ("no-cache", "no-store"):
                self.refreshes.labels(tenant, control, "allowed" if refresh else "refused")

    def count(self, counter: Counter, label: str) -> None:
        """Count one event on a counter with one label, from the hit path (canonical rules,
        parameter rewrites): the labelled child is kept, as in observe_request."""
        child = self._labelled.get((counter, label))
        if child is None:
            child = self._labelled[counter, label] = counter.labels(label)
        child.inc()

    def observe_request(self, route: str, model: str, cache: str, code: str, seconds: float) -> None:
        """Count a finished request. Labelled children are kept, since resolving labels on every
        request costs more than the update itself on the hit path."""
        key = (route, model, cache, code)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.requests.labels(*key), self.request_duration.labels(route, cache))
        children[0].inc()
        children[1].observe(seconds)
