"""The dashboards and alerts against live data: a real Prometheus, loaded with the shipped
scrape config and alert rules, scrapes a real `detgate serve` (Redis store, fake upstream)
and a real `detgate backend` (CPU, tiny checkpoint) while the official client drives a
mixed load through the gateway; then Redis is killed. Every dashboard and alert expression
is evaluated through Prometheus's HTTP API."""
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
CORE_SERIES = contract.series_index(contract.GATEWAY_CORE)
BACKEND_SERIES = contract.series_index(contract.BACKEND)


class Live:
    def __init__(self, stack: live_stack.Stack, start: float, seen_before, seen_after):
        self.stack, self.start, self.seen_before, self.seen_after = stack, start, seen_before, seen_after
        self.end = time.time()
        self.gateway_metrics = _get(f"{stack.gateway}/metrics").decode()
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


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
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
        seen_before = asyncio.run(live_stack.drive(stack, rounds=3, tag=f"live{start}"))
        live_stack.wait_for_scrapes()
        # Redis crashes: the gateway must count the failures the dashboard and alert watch.
        stack.redis.kill9()
        seen_after = asyncio.run(live_stack.drive(stack, rounds=1, tag=f"noredis{start}"))
        live_stack.wait_for_scrapes(3)
        yield Live(stack, start, seen_before, seen_after)


def test_the_load_exercised_every_cache_path(live):
    for status in ("miss", "hit", "coalesced", "bypass", 400, 500):
        assert live.seen_before[status] > 0, (status, live.seen_before)


def test_gateway_keeps_answering_after_redis_crashes(live):
    answered = sum(n for status, n in live.seen_after.items() if isinstance(status, str))
    assert answered > 0 and live.seen_after[500] == 1, live.seen_after  # the one 500 is the failing upstream's


def test_gateway_exports_every_core_metric(live):
    assert set(CORE_SERIES) - exported_series(live.gateway_metrics) == set()
    assert set(CORE_SERIES) - set(live.api("label/__name__/values")["data"]) == set()


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


def test_gateway_core_panels_show_data(live):
    """Panels about what every gateway exports today must not be empty under load."""
    empty = []
    for q in promql.dashboard_queries(promql.load_dashboard("gateway")):
        if all(s in CORE_SERIES for s, _ in promql.series(q.expr)):
            answer = live.evaluate(q)
            if answer["status"] != "success" or not has_data(answer):
                empty.append(q.source)
    assert empty == []


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
            if metric in contract.GATEWAY_CORE or metric in contract.BACKEND:
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


def test_redis_loss_and_failing_upstream_raise_their_alerts(live):
    """Both alerts wait out their `for:` before firing, so here they must be pending."""
    alerts = live.api("alerts")["data"]["alerts"]
    states = {(a["labels"]["alertname"], a["state"]) for a in alerts}
    assert {("DetgateCacheErrors", "pending"), ("DetgateUpstreamErrorRate", "pending")} <= states, states
    quiet = {"DetgateGatewayDown", "DetgateHitRatioDrop", "DetgateDeterminismAuditMismatch"}
    assert not {name for name, _ in states} & quiet, states
