"""Draw a provisioned Grafana dashboard as a PNG from live Prometheus query results.

No Grafana server can be installed on the machines this project is built on, so the
screenshots are drawn here instead: the same panels at the same grid positions, each
running its own queries against a real Prometheus over the chosen time range. It is a
rendering of the dashboard's data, not a picture taken of Grafana.

    python3 deploy/screenshots/render_dashboard.py --prometheus http://127.0.0.1:9090 \
        --dashboard deploy/grafana/dashboards/gateway.json --minutes 5 --out deploy/screenshots/gateway.png

Needs matplotlib (not a dependency of detgate itself).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

BG, PANEL, TEXT, MUTED, GRID = "#111217", "#181b1f", "#d8d9da", "#8e8e8e", "#2c3235"
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#ffcb7d"]
CELL_W, ROW_H = 1.0, 0.42  # inches per grid column and per grid row
GRAFANA_VARIABLE = re.compile(r"\$\{?(\w+)\}?")


def fetch(prometheus: str, path: str, **params) -> dict:
    url = f"{prometheus}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())["data"]


def legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt or "") or json.dumps(labels)


def run_queries(panel: dict, prometheus: str, start: float, end: float, step: float, rate_interval: str) -> list:
    """[(legend, [times], [values])] for every series of every query of the panel."""
    values = {"__rate_interval": rate_interval, "__range": f"{int(end - start)}s", "__interval": f"{int(step)}s"}
    out = []
    for target in panel.get("targets", []):
        expr = GRAFANA_VARIABLE.sub(lambda m: values.get(m.group(1), ".*"), target["expr"])
        if target.get("instant"):
            for series in fetch(prometheus, "query", query=expr, time=end)["result"]:
                out.append((legend(target.get("legendFormat"), series["metric"]), [end], [float(series["value"][1])]))
            continue
        data = fetch(prometheus, "query_range", query=expr, start=start, end=end, step=step)
        for series in data["result"]:
            ts = [float(t) for t, _ in series["values"]]
            vs = [float(v) for _, v in series["values"]]
            out.append((legend(target.get("legendFormat"), series["metric"]), ts, vs))
    # A series that is NaN throughout (a 0/0 ratio) is no data, as Grafana shows it.
    return [s for s in out if any(math.isfinite(v) for v in s[2])]


def fmt(value: float, unit: str | None, decimals: int | None = None) -> str:
    if not math.isfinite(value):
        return "NaN"
    if decimals is not None and unit in (None, "short", "none"):
        return f"{value:.{decimals}f}"
    if unit == "percentunit":   # three significant digits: 0.05% and 0.15% ticks stay apart
        return f"{value * 100:.3g}%"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB"):
            if abs(value) < 1024:
                return f"{value:.0f} {suffix}"
            value /= 1024
        return f"{value:.1f} TiB"
    suffix = {"reqps": " req/s", "ops": " ops/s"}.get(unit or "", "")
    return f"{value:.3g}{suffix}"


def last_finite(vs: list[float]) -> float:
    finite = [v for v in vs if math.isfinite(v)]
    return finite[-1] if finite else math.nan


def mapped(value: float, defaults: dict) -> tuple[str, str | None]:
    for mapping in defaults.get("mappings", []):
        hit = mapping["options"].get(str(int(value))) if math.isfinite(value) else None
        if hit:
            return hit["text"], hit.get("color")
    return fmt(value, defaults.get("unit"), defaults.get("decimals")), None


def threshold_color(value: float, defaults: dict) -> str:
    color = PALETTE[0]
    for step in defaults.get("thresholds", {}).get("steps", []):
        if step["value"] is None or (math.isfinite(value) and value >= step["value"]):
            color = step["color"]
    return {"green": "#73bf69", "orange": "#ff9830", "red": "#f2495c"}.get(color, color)


def no_data(ax) -> None:
    ax.text(0.5, 0.45, "No data", ha="center", va="center", color=MUTED, fontsize=11, transform=ax.transAxes)


def draw_timeseries(ax, series, defaults, start: float, end: float) -> None:
    unit = defaults.get("unit")
    for i, (name, ts, vs) in enumerate(series):
        ax.plot([dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in ts], vs, color=PALETTE[i % len(PALETTE)],
                lw=1.4, label=name)
    # The dashboard's whole time range, as Grafana shows it, even where a series starts late.
    ax.set_xlim(dt.datetime.fromtimestamp(start, dt.timezone.utc), dt.datetime.fromtimestamp(end, dt.timezone.utc))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: fmt(v, unit)))
    ax.tick_params(colors=MUTED, labelsize=6.5)
    ax.grid(color=GRID, lw=0.5)
    for spine in ax.spines.values():
        spine.set_visible(False)
    if series:
        ax.legend(loc="upper left", fontsize=6, frameon=False, labelcolor=TEXT, ncol=3)


def draw_stat(ax, series, defaults, named: bool) -> None:
    ax.axis("off")
    cells = [(name, last_finite(vs)) for name, _, vs in series]
    for i, (name, value) in enumerate(cells):
        text, color = mapped(value, defaults)
        x = (i + 0.5) / len(cells)
        ax.text(x, 0.5, text, ha="center", va="center", fontsize=20 if len(cells) < 3 else 13, weight="bold",
                color=color or threshold_color(value, defaults), transform=ax.transAxes)
        if len(cells) > 1 or named:
            ax.text(x, 0.15, name, ha="center", color=MUTED, fontsize=7, transform=ax.transAxes)


def draw_table(ax, series, defaults) -> None:
    ax.axis("off")
    rows = [(name, fmt(last_finite(vs), defaults.get("unit"), defaults.get("decimals"))) for name, _, vs in series]
    for i, (name, value) in enumerate(rows[:8]):
        y = 0.85 - i * 0.11
        ax.text(0.02, y, name, color=TEXT, fontsize=7, transform=ax.transAxes)
        ax.text(0.98, y, value, color=TEXT, fontsize=7, ha="right", transform=ax.transAxes)


def draw_heatmap(ax, series, defaults) -> None:
    buckets = sorted(series, key=lambda s: float(s[0]) if s[0] != "+Inf" else math.inf)
    counts = [[max(v, 0) if math.isfinite(v) else 0 for v in vs] for _, _, vs in buckets]
    # Cumulative bucket counters become per-bucket counts.
    grid = [counts[0]] + [[b - a for a, b in zip(lo, hi)] for lo, hi in zip(counts, counts[1:])]
    # Empty cells show the panel through, as in Grafana's heatmap.
    empty = [[math.nan if c <= 0 else c for c in row] for row in grid]
    ax.imshow(empty, aspect="auto", origin="lower", cmap="Oranges", interpolation="nearest")
    ax.set_yticks(range(len(buckets)), [name for name, _, _ in buckets], fontsize=6, color=MUTED)
    ax.set_xticks([])


def draw(panel: dict, ax, series: list, start: float, end: float) -> None:
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    ax.set_facecolor(PANEL)
    ax.set_title(panel["title"], loc="left", color=TEXT, fontsize=8.5, pad=4)
    if not series:
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
        no_data(ax)
        return
    if panel["type"] in ("stat", "gauge", "state-timeline"):
        # A legend that names a label says which series each number is.
        named = any("{{" in t.get("legendFormat", "") for t in panel["targets"])
        draw_stat(ax, series, defaults, named)
        return
    if panel["type"] == "timeseries":
        draw_timeseries(ax, series, defaults, start, end)
        return
    {"table": draw_table, "heatmap": draw_heatmap}[panel["type"]](ax, series, defaults)


def render(dashboard: dict, prometheus: str, start: float, end: float, out: Path, rate_interval: str) -> None:
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width, height = 24 * CELL_W, rows * ROW_H + 0.9
    fig = plt.figure(figsize=(width, height), facecolor=BG)
    stamp = dt.datetime.fromtimestamp(end, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    fig.text(0.01, 1 - 0.3 / height, dashboard["title"], color=TEXT, fontsize=15, weight="bold", va="top")
    fig.text(0.99, 1 - 0.3 / height, f"drawn from live Prometheus queries, last {int((end - start) / 60)} min to {stamp} "
             "(not a Grafana screenshot)", color=MUTED, fontsize=8, va="top", ha="right")
    step = max(1.0, (end - start) / 300)
    for p in panels:
        g = p["gridPos"]
        left, top = g["x"] / 24, 1 - (0.9 + g["y"] * ROW_H) / height
        w, h = g["w"] / 24, g["h"] * ROW_H / height
        if p["type"] == "row":
            fig.text(left + 0.005, top - h / 2, p["title"], color=TEXT, fontsize=11, weight="bold", va="center")
            continue
        # Leave room inside the cell for the title, the tick labels and the gap between panels.
        ax = fig.add_axes((left + 0.035 * w + 0.012, top - h + 0.28 / height, w * 0.965 - 0.02, h - 0.62 / height))
        draw(p, ax, run_queries(p, prometheus, start, end, step, rate_interval), start, end)
    fig.savefig(out, dpi=80, facecolor=BG)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", required=True, type=Path)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--rate-interval", default="20s", help="what $__rate_interval stands for")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    end = time.time()
    render(json.loads(args.dashboard.read_text()), args.prometheus.rstrip("/"), end - args.minutes * 60, end,
           args.out, args.rate_interval)
    print(args.out)


if __name__ == "__main__":
    main()
