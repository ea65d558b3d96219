"""The end of `make test`: one line per pytest suite (tests ran, passed, failed, errors,
skipped), read from the suite's JUnit report and exit code, and exit 1 unless every suite
passed and ran at least one test.

    python3 scripts/test_summary.py REPORT_DIR SUITE...   # reads REPORT_DIR/SUITE.xml, .rc

Counted per test, not from the <testsuite> totals: a test that fails and then errors in
teardown is two <testcase> entries of one name there, and one failed test here. A suite
that ran nothing fails too: a bad path, a conftest that skips everything, or an import
error in collection all look like an empty run otherwise.
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

COLUMNS = ("ran", "passed", "failed", "errors", "skipped")


def counts(report: Path) -> dict[str, int] | None:
    """Counts from a pytest --junitxml report; None if there is none (pytest died first)."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return None
    tests: dict[tuple, set[str]] = {}
    for case in root.iter("testcase"):
        tests.setdefault((case.get("classname"), case.get("name")), set()).update(ch.tag for ch in case)
    c = dict.fromkeys(COLUMNS, 0)
    for kinds in tests.values():
        kind = ("failed" if "failure" in kinds else "errors" if "error" in kinds
                else "skipped" if "skipped" in kinds else "passed")
        c[kind] += 1
    c["ran"] = c["passed"] + c["failed"] + c["errors"]
    return c


def verdict(c: dict[str, int] | None, rc: str) -> str:
    if c is None:
        return f"FAILED: no report (pytest exit {rc})"
    if c["ran"] == 0:
        return f"FAILED: ran no test (pytest exit {rc})"
    if c["failed"] or c["errors"] or rc != "0":
        return f"FAILED (pytest exit {rc})"
    return "ok"


def main(argv: list[str]) -> int:
    reports, suites = Path(argv[1]), argv[2:]
    width = max(len(s) for s in ["suite", *suites])
    print("\n" + "suite".ljust(width) + "".join(f"{k:>9}" for k in COLUMNS) + "  result")
    ok = True
    for suite in suites:
        c = counts(reports / f"{suite}.xml")
        rc_file = reports / f"{suite}.rc"
        rc = rc_file.read_text().strip() if rc_file.exists() else "?"
        result = verdict(c, rc)
        ok &= result == "ok"
        cells = "".join(f"{(c[k] if c else '-'):>9}" for k in COLUMNS)
        print(suite.ljust(width) + cells + "  " + result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
