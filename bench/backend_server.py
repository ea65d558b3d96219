"""Start `detgate backend` in a child process for a benchmark, wait until it serves, read its metrics."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def backend(model: Path, port: int, log_path: Path, *args: str, timeout_s: float = 240):
    """Yields the base URL once /healthz answers; the server is stopped on exit."""
    cmd = [sys.executable, "-m", "local_backend.cli", "--model", str(model), "--port", str(port),
           "--served-model-name", "bench", *args]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"backend exited with {proc.returncode}; see {log_path}")
                try:
                    with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"backend not up after {timeout_s}s; see {log_path}")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def metrics(url: str) -> dict[str, float]:
    """The running backend's /metrics: each sample's name (labels included) -> its value."""
    with urllib.request.urlopen(url + "/metrics") as r:
        lines = r.read().decode().splitlines()
    values = {}
    for line in lines:
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
