"""The provisioned dashboards and alert rules: valid for Grafana's schema, laid out sanely,
wired to the provisioned datasource, and naming only metrics and labels the services export."""
from __future__ import annotations

import itertools
import json
import re

import pytest
import yaml

from . import metric_contract as contract
from . import promql

DATASOURCES = promql.DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_NAMES = sorted(promql.DASHBOARDS)
# Which contract each dashboard must cover completely.
COVERS = {
    "gateway": contract.GATEWAY,
    "backend": contract.BACKEND,
}
REQUIRED_ALERTS = {
    "DetgateModelDrift", "DetgateCanaryMismatch", "DetgateCacheErrors",
    "DetgateHitRatioDrop", "DetgateUpstreamErrorRate", "DetgateDeterminismAuditMismatch",
}
KNOWN = {**contract.ALL, **contract.SYNTHETIC}
SERIES = contract.series_index(KNOWN)


def provisioned_datasource() -> dict:
    (ds,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    return ds


def test_every_dashboard_has_a_contract():
    assert set(DASHBOARD_NAMES) == set(COVERS)


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_grafana_schema_keeps_every_field(name):
    """Decode with the types Grafana generates from its own schema and encode again: a key
    the schema does not know is dropped, so any difference is a field Grafana ignores."""
    pytest.importorskip("grafana_foundation_sdk", reason="the grafana-foundation-sdk test dependency is not installed")
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import dashboard as grafana

    register_default_plugins()
    raw = promql.load_dashboard(name)
    model = grafana.Dashboard.from_json(raw)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert _lost(raw, again) == []
    for panel in model.panels:
        if isinstance(panel, grafana.Panel):
            # An unknown panel type has no schema, so its options stay a plain dict.
            assert not isinstance(panel.options, dict), f"unknown panel type {panel.type!r}"
            assert all(not isinstance(t, dict) for t in panel.targets), f"{panel.title}: targets not Prometheus queries"


def _lost(ours, theirs, path="") -> list[str]:
    """Paths of values in `ours` that `theirs` lacks or holds differently (extra defaults in `theirs` are fine)."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [path]
        return [lost for k, v in ours.items() for lost in (_lost(v, theirs[k], f"{path}/{k}") if k in theirs else [f"{path}/{k}"])]
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [path]
        return [lost for i, (a, b) in enumerate(zip(ours, theirs)) for lost in _lost(a, b, f"{path}[{i}]")]
    return [] if ours == theirs else [f"{path}: {ours!r} became {theirs!r}"]


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_layout(name):
    d = promql.load_dashboard(name)
    assert d["uid"] == f"detgate-{name}"
    panels = promql.panels(d)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells = {}
    for p in panels:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("x", "y", "w", "h")), p["title"]
        assert g["x"] >= 0 and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for cell in itertools.product(range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])):
            assert cell not in cells, f"{p['title']!r} overlaps {cells[cell]!r}"
            cells[cell] = p["title"]


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_wired_to_the_provisioned_datasource(name):
    ds = provisioned_datasource()
    want = {"type": ds["type"], "uid": ds["uid"]}
    d = promql.load_dashboard(name)
    for p in promql.panels(d):
        if p["type"] == "row":
            continue
        assert p["datasource"] == want, p["title"]
        assert p["targets"], f"{p['title']} has no query"
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == want and t["expr"].strip(), p["title"]
    for v in d["templating"]["list"]:
        assert v["datasource"] == want, v["name"]


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_variables_are_defined_and_used(name):
    d = promql.load_dashboard(name)
    defined = [v["name"] for v in d["templating"]["list"]]
    assert len(defined) == len(set(defined))
    used = set().union(*(promql.variables(q.expr) for q in promql.dashboard_queries(d)))
    assert used - promql.GRAFANA_BUILTINS <= set(defined), "query uses an undefined variable"
    assert set(defined) <= used, "variable defined but no panel uses it"
    for var, query in promql.variable_queries(d):
        parsed = promql.label_values(query)
        assert parsed, f"${var}: expected label_values(metric, label), got {query!r}"
        metric, selector, label = parsed
        assert metric in KNOWN and label in KNOWN[metric].labels + contract.TARGET_LABELS, query
        _check_refs(promql.Query(f"{name} / ${var}", selector, True))


def _check_refs(query: promql.Query) -> None:
    named = promql.series(query.expr)
    assert named, f"{query.source}: names no metric"
    labels_in_scope = set(contract.TARGET_LABELS)
    for series, matcher_labels in named:
        assert series in SERIES, f"{query.source}: {series} is not a metric the services export"
        metric_name, metric = SERIES[series]
        allowed = set(metric.labels) | set(contract.TARGET_LABELS)
        if series.endswith("_bucket") and metric.kind == "histogram":
            allowed.add(contract.BUCKET_LABEL)
        assert matcher_labels <= allowed, f"{query.source}: {series} has no label {matcher_labels - allowed}"
        labels_in_scope |= allowed
    unknown = promql.grouping_labels(query.expr) - labels_in_scope
    assert not unknown, f"{query.source}: groups by {unknown}, which none of its metrics has"


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_dashboard_queries_name_exported_metrics(name):
    d = promql.load_dashboard(name)
    for q in promql.dashboard_queries(d):
        _check_refs(q)
    shown = {SERIES[s][0] for q in promql.dashboard_queries(d) for s, _ in promql.series(q.expr)}
    assert set(COVERS[name]) - shown == set(), "metrics without a panel"


def test_alert_queries_name_exported_metrics():
    for q in promql.alert_queries():
        _check_refs(q)


def test_alert_rules_are_complete():
    rules = {r["alert"]: r for r in promql.alert_rules()}
    assert REQUIRED_ALERTS <= set(rules)
    for name, r in rules.items():
        assert re.fullmatch(r"\d+[smh]", r["for"]), name
        assert r["labels"]["severity"] in {"warning", "critical"}, name
        assert r["annotations"]["summary"].strip() and r["annotations"]["description"].strip(), name
