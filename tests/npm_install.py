"""Installing the pinned npm packages a suite drives, shared by the agent and client suites."""
from __future__ import annotations

import shutil
import subprocess
from typing import Callable

import pytest


def _registry_reachable() -> bool:
    try:
        return subprocess.run(["npm", "ping"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_installed(what: str, installed: Callable[[], bool],
                     install: Callable[[], subprocess.CompletedProcess]) -> None:
    """Installs `what` when missing; skips only when the registry itself is unreachable, so an
    offline machine is told why while a broken install still fails."""
    if installed():
        return
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed: run scripts/setup.sh (make test does)")
    done = install()
    if done.returncode != 0 and not _registry_reachable():
        pytest.skip(f"the npm registry is unreachable, so {what} cannot be installed: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0 and installed(), f"npm install of {what} failed:\n{done.stderr[-2000:]}"
