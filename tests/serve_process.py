"""Waiting for a spawned `detgate serve` to answer, shared by the suites that run it as a process."""
from __future__ import annotations

import subprocess
import time
import urllib.request
from typing import Callable


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float, exit_output: Callable[[], str]) -> None:
    """Polls url/healthz until it answers; an early exit raises with exit_output() (the process's stderr)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"detgate serve exited: {exit_output()}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("detgate serve did not become healthy")
