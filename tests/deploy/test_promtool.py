"""Prometheus's own checker on the shipped config and rules, and the alert unit tests."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from . import promql

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool comes with the Debian prometheus package (scripts/setup.sh)")
HERE = Path(__file__).resolve().parent


def promtool(*args: str, cwd: Path) -> str:
    done = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_config_is_valid(tmp_path):
    # Also loads rule_files relative to the config, so the compose layout is checked too;
    # promtool also wants the operator token file compose mounts, so a copy points at one.
    shutil.copytree(promql.ALERTS.parent, tmp_path, dirs_exist_ok=True)
    (tmp_path / "operator_token").write_text("token")
    shipped = (tmp_path / "prometheus.yml").read_text()
    assert "/run/secrets/operator_token" in shipped
    (tmp_path / "prometheus.yml").write_text(shipped.replace("/run/secrets/operator_token", str(tmp_path / "operator_token")))
    out = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert "1 rule files found" in out


def test_rules_are_valid():
    promtool("check", "rules", promql.ALERTS.name, cwd=promql.ALERTS.parent)


def test_alerts_fire_when_they_should():
    promtool("test", "rules", "alerts_test.yml", cwd=HERE)
