"""The markdown table of a benchmark's result rows, for the .md files beside its JSON."""
from __future__ import annotations


def markdown_table(rows: list[dict], cols: list[str] | None = None) -> str:
    """One row per dict; cols default to every key of any row, in first-seen order (a row
    without one leaves its cell empty)."""
    cols = cols or list(dict.fromkeys(c for r in rows for c in r))
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows])
