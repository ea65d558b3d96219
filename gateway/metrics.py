"""The Prometheus metrics, one registry per app so that several apps can share a process.

Names and labels are a contract with the Grafana dashboards in deploy/: change them together.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.canonical_rules = Counter("detgate_canonical_rules", "Canonicalization rules that changed a request.",
                                       ["rule"], registry=r)
        self.cache_entries_bytes = Gauge("detgate_cache_entries_bytes", "Bytes held by the in-process store.", registry=r)
        self.inflight = Gauge("detgate_inflight_requests", "Requests being answered right now.", registry=r)
        self._children: dict[tuple[str, str, str, str], tuple[Counter, Histogram]] = {}

    def observe_request(self, route: str, model: str, cache: str, code: str, seconds: float) -> None:
        """Count a finished request. Labelled children are kept, since resolving labels on every
        request costs more than the update itself on the hit path."""
        key = (route, model, cache, code)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.requests.labels(*key), self.request_duration.labels(route, cache))
        children[0].inc()
        children[1].observe(seconds)
