"""The dashboards and alerts against live data: a real Prometheus, loaded with the shipped
scrape config and alert rules, scrapes a real `detgate serve` (Redis store, fake upstreams)
and a real `detgate backend` (CPU, tiny checkpoint) while the official client drives a
mixed load through the gateway; then a model update, a circuit breaker opening and a
tampered entry happen, and Redis is killed. Every dashboard and alert expression is
evaluated through Prometheus's HTTP API, and every gateway panel must show what its load
caused."""
from __future__ import annotations

import asyncio
import json
import math
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from . import live_stack
from . import metric_contract as contract
from . import promql

pytestmark = pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("redis-server")),
                                reason="needs the Debian prometheus and redis-server packages (scripts/setup.sh)")

# Every dashboard variable set to "All", as a first visit to a dashboard has them.
ALL = ".*"
RATE_INTERVAL = "20s"  # what $__rate_interval would be for a short scrape interval: several samples per window
GATEWAY_SERIES = contract.series_index(contract.GATEWAY)
BACKEND_SERIES = contract.series_index(contract.BACKEND)


class Live:
    def __init__(self, stack: live_stack.Stack, start: float, seen_before, seen_after):
        self.stack, self.start, self.seen_before, self.seen_after = stack, start, seen_before, seen_after
        self.end = time.time()
        self.gateway_metrics = _get(f"{stack.gateway}/metrics", live_stack.OPERATOR_TOKEN).decode()
        self.backend_metrics = _get(f"{stack.backend}/metrics").decode()
        self.backend_health = json.loads(_get(f"{stack.backend}/healthz"))

    def api(self, path: str, **params) -> dict:
        url = f"{self.stack.prometheus}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:  # Prometheus answers a bad query with 400 and a JSON reason
            return json.loads(exc.read())

    def evaluate(self, query: promql.Query) -> dict:
        values = {"__rate_interval": RATE_INTERVAL, "__range": f"{math.ceil(self.end - self.start) + 1}s",
                  "__interval": "1s"}
        expr = promql.substitute(query.expr, values | _all_variables(query.expr))
        if query.instant:
            return self.api("query", query=expr, time=self.end)
        return self.api("query_range", query=expr, start=self.start, end=self.end, step=1)


def _get(url: str, token: str | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
        return r.read()


def exported_series(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def _all_variables(expr: str) -> dict[str, str]:
    return {v: ALL for v in promql.variables(expr) - promql.GRAFANA_BUILTINS}


def has_data(answer: dict) -> bool:
    result = answer["data"]["result"]
    if answer["data"]["resultType"] == "matrix":
        values = [float(v) for series in result for _, v in series["values"]]
    else:
        values = [float(series["value"][1]) for series in result]
    return any(math.isfinite(v) for v in values)


@pytest.fixture(scope="module")
def live():
    with live_stack.running() as stack:
        start = time.time()
        live_stack.wait_for_scrapes()
        tag = f"live{start}"
        seen_before = asyncio.run(live_stack.drive(stack, rounds=3, tag=tag))
        # Twice, scrapes apart: rate() sees no increase in a counter's first sample, so an
        # event that happened once is invisible in rate panels until it happens again.
        for update in (1, 2):
            seen_before += asyncio.run(live_stack.incidents(stack, tag, update))
            live_stack.wait_for_scrapes()
        # Redis crashes: the gateway must count the failures the dashboard and alert watch.
        stack.redis.kill9()
        seen_after = asyncio.run(live_stack.drive(stack, rounds=1, tag=f"noredis{start}"))
        live_stack.wait_for_scrapes(3)
        yield Live(stack, start, seen_before, seen_after)


def test_the_load_exercised_every_path(live):
    statuses = {status for _, status in live.seen_before}
    assert {"miss", "hit", "coalesced", "bypass"} <= statuses, live.seen_before
    for caused in [("bad", 400), ("doomed", 500), ("burst", 429), ("batch", 429), ("breaker", 503),
                   ("together", "coalesced"), ("vote", "hit"), ("tampered", "miss")]:
        assert live.seen_before[caused] > 0, (caused, live.seen_before)


def test_gateway_keeps_answering_after_redis_crashes(live):
    """Requests whose upstream is healthy are all answered, uncached; the one 500 is the
    failing upstream's own."""
    for kind in ("plain", "stream", "dirty", "together", "embed", "local"):
        answered = {status for k, status in live.seen_after if k == kind}
        assert answered == {"bypass"}, (kind, live.seen_after)
    assert live.seen_after["doomed", 500] == 1, live.seen_after


def test_gateway_exports_every_metric(live):
    assert set(GATEWAY_SERIES) - exported_series(live.gateway_metrics) == set()
    assert set(GATEWAY_SERIES) - set(live.api("label/__name__/values")["data"]) == set()


def test_backend_exports_every_metric(live):
    assert set(BACKEND_SERIES) - exported_series(live.backend_metrics) == set()
    assert set(BACKEND_SERIES) - set(live.api("label/__name__/values")["data"]) == set()


@pytest.mark.parametrize("name", sorted(promql.DASHBOARDS))
def test_every_dashboard_query_evaluates(live, name):
    failures = []
    for q in promql.dashboard_queries(promql.load_dashboard(name)):
        answer = live.evaluate(q)
        if answer["status"] != "success" or answer.get("warnings"):
            failures.append((q.source, answer.get("error") or answer.get("warnings")))
    assert failures == []


# What each gateway panel must show, beyond some non-zero value: label -> values that each
# need a series of their own that rose above zero. Each is caused by the live stack's load.
SHOWS = {
    "Requests per second by cache status / A": {"cache": {"miss", "hit", "coalesced", "bypass"}},
    "Responses by status code / A": {"code": {"200", "400", "429", "500", "503"}},
    "Latency p50 / p99 by cache status / A": {"cache": {"miss", "hit", "bypass"}},
    "Upstream calls by upstream and code / A": {"upstream": {"fake", "noisy", "flaky", "pinned", "local"},
                                                "code": {"200", "429", "500"}},
    "Upstream error ratio / A": {"upstream": {"fake", "flaky"}},
    "Upstream retries and saturation / A": {"upstream": {"fake", "flaky"}, "reason": {"5xx", "429"}},
    "Upstream retries and saturation / B": {"upstream": {"fake"}, "why": {"queue_full", "queue_timeout"}},
    "Circuit breakers open / A": {"upstream": {"flaky"}},
    "Tenants: rate limits and cache refreshes / A": {"tenant": {"batch"}},
    "Tenants: rate limits and cache refreshes / B": {"tenant": {"app"}, "control": {"no-store"}, "outcome": {"allowed"}},
    "Sampling parameters rewritten / A": {"param": {"temperature", "seed"}},
    "Hidden variables detected / A": {"kind": {"date", "uuid"}},
    "Cache errors by operation / A": {"op": {"get", "put"}},
    "Cache bypasses, and answers not stored / A": {"reason": {"store_down", "no-store"}},
    "Cache bypasses, and answers not stored / B": {"finish": {"content_filter"}},
    "Schema-validated attempts / A": {"result": {"valid", "invalid"}},
    "Drift events (dashboard time range) / A": {"kind": {"fingerprint", "canary"}, "upstream": {"pinned"}},
    # "recorded" happens once per canary, in its series' first sample: no rate() can show it.
    "Canary runs by result / A": {"result": {"match", "mismatch"}},
}
# Gauges where zero is the answer most of the time (no request in flight while Prometheus
# scrapes; nothing in an in-process store when Redis holds the entries): data is enough.
ZERO_IS_AN_ANSWER = {"In-flight requests / A", "Cache size (in-process store) / A"}


def peaks(answer: dict) -> list[tuple[dict, float]]:
    """Each series' labels and its largest finite value."""
    out = []
    for series in answer["data"]["result"]:
        values = series["values"] if answer["data"]["resultType"] == "matrix" else [series["value"]]
        finite = [float(v) for _, v in values if math.isfinite(float(v))]
        if finite:
            out.append((series["metric"], max(finite)))
    return out


def test_every_gateway_panel_shows_what_the_load_caused(live):
    dashboard = promql.load_dashboard("gateway")
    sources = {q.source.split(" / ", 1)[1] for q in promql.dashboard_queries(dashboard)}
    assert set(SHOWS) | ZERO_IS_AN_ANSWER <= sources, "an expectation names a panel that is gone"
    wrong = []
    for q in promql.dashboard_queries(dashboard):
        panel = q.source.split(" / ", 1)[1]
        answer = live.evaluate(q)
        if answer["status"] != "success" or not has_data(answer):
            wrong.append((panel, "no data"))
            continue
        risen = [labels for labels, peak in peaks(answer) if peak > 0]
        if panel not in ZERO_IS_AN_ANSWER and not risen:
            wrong.append((panel, "only zeros"))
        for label, values in SHOWS.get(panel, {}).items():
            missing = values - {labels.get(label) for labels in risen}
            if missing:
                wrong.append((panel, label, sorted(missing)))
    assert not wrong, wrong


def test_canary_status_shows_the_model_update(live):
    """The canary matched its recorded answer until the pinned model changed, then not."""
    (query,) = [q for q in promql.dashboard_queries(promql.load_dashboard("gateway")) if "/ Canary status /" in q.source]
    (series,) = live.evaluate(query)["data"]["result"]
    values = [float(v) for _, v in series["values"]]
    assert 1.0 in values and values[-1] == 0.0 and values.index(1.0) < values.index(0.0), values


def test_backend_panels_show_data(live):
    # Without prefix caching (the CPU path runs without it) the hit rate is 0/0: no data is right.
    exempt = set() if live.backend_health["prefix_caching"] else {"detgate-backend / Prefix-cache hit rate / A"}
    empty = []
    for q in promql.dashboard_queries(promql.load_dashboard("backend")):
        answer = live.evaluate(q)
        if q.source not in exempt and (answer["status"] != "success" or not has_data(answer)):
            empty.append(q.source)
    assert empty == []


def test_dashboard_variables_list_values(live):
    for name in promql.DASHBOARDS:
        for var, query in promql.variable_queries(promql.load_dashboard(name)):
            metric, selector, label = promql.label_values(query)
            values = live.api(f"label/{label}/values", **{"match[]": selector})["data"]
            if metric in contract.ALL:
                assert values, f"{name}: ${var} would offer nothing to pick"


def test_every_alert_expression_evaluates(live):
    for q in promql.alert_queries():
        answer = live.evaluate(q)
        assert answer["status"] == "success" and not answer.get("warnings"), (q.source, answer)


def test_prometheus_loaded_and_evaluates_every_alert_rule(live):
    groups = live.api("rules", type="alert")["data"]["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(loaded) == {r["alert"] for r in promql.alert_rules()}
    for name, rule in loaded.items():
        assert rule["health"] == "ok" and not rule.get("lastError"), (name, rule)


def test_incidents_raise_their_alerts(live):
    """Redis lost, failing upstreams, the model update and the canary's changed answer: each
    alert waits out its `for:` before firing, so here they must be pending."""
    alerts = live.api("alerts")["data"]["alerts"]
    states = {(a["labels"]["alertname"], a["state"]) for a in alerts}
    raised = {"DetgateCacheErrors", "DetgateUpstreamErrorRate", "DetgateModelDrift", "DetgateCanaryMismatch"}
    assert {(name, "pending") for name in raised} <= states, states
    quiet = {"DetgateGatewayDown", "DetgateHitRatioDrop", "DetgateDeterminismAuditMismatch"}
    assert not {name for name, _ in states} & quiet, states
