"""What a PromQL expression refers to (series, labels, Grafana variables), and the queries
the dashboards and alert rules hold. Text-level, which is enough: the live test has a real
Prometheus parse and evaluate every expression; this finds what they name without one."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = {p.stem: p for p in sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))}
ALERTS = DEPLOY / "prometheus" / "alerts.yml"

# Grafana fills these in itself; everything else after a `$` must be a dashboard variable.
GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval"}

_SERIES = re.compile(r"\b(detgate_[A-Za-z0-9_]+|up)\b(\s*\{([^}]*)\})?")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


@dataclasses.dataclass(frozen=True)
class Query:
    source: str   # where it lives, for failure messages
    expr: str
    instant: bool  # evaluated at one time (table, alert) rather than over the time range


def series(expr: str) -> list[tuple[str, set[str]]]:
    """Each series selector: its name and the label names its matchers use."""
    out = []
    for m in _SERIES.finditer(_blank_strings(expr)):
        matchers = m.group(3) or ""
        out.append((m.group(1), set(_MATCHER_LABEL.findall(matchers))))
    return out


def grouping_labels(expr: str) -> set[str]:
    return {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}


def variables(expr: str) -> set[str]:
    return set(_VARIABLE.findall(expr))


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana variables the way Grafana would before sending the query."""
    return _VARIABLE.sub(lambda m: values[m.group(1)], expr)


def _blank_strings(expr: str) -> str:
    # Label values such as "up" must not be mistaken for series names.
    return _STRING.sub('""', expr)


def load_dashboard(name: str) -> dict:
    return json.loads(DASHBOARDS[name].read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, rows included, with panels nested in collapsed rows flattened in."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_queries(dashboard: dict) -> list[Query]:
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            out.append(Query(f"{dashboard['uid']} / {p['title']} / {t['refId']}", t["expr"], bool(t.get("instant"))))
    return out


def variable_queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(v["name"], v["query"]["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]


def label_values(query: str) -> tuple[str, str, str] | None:
    """Grafana's `label_values(metric{selector}, label)` as (metric, metric{selector}, label)."""
    m = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?,\s*(\w+)\)", query)
    return (m.group(1), m.group(1) + (m.group(2) or ""), m.group(3)) if m else None


def alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_queries() -> list[Query]:
    return [Query(f"alert {r['alert']}", r["expr"], True) for r in alert_rules()]
