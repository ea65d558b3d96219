"""A real redis-server as a child process that tests can kill -9 and bring back.

`restart()` starts the server again on the same port and directory, so clients that
reconnect find it where it was (with its data, if `appendonly` kept any).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from fakes.loopback import bindable, free_port


def ping(port: int, timeout: float = 0.2) -> bool:
    """True when a Redis answers PING on the port (raw RESP: no client library needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    def __init__(self, directory: Path, port: int | None = None, *extra: str, appendonly: bool = False):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port if port is not None else free_port()
        self.extra = extra
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--logfile", str(self.dir / f"redis-{self.port}.log"),
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> RedisProcess:
        if self.running:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + timeout
        while not ping(self.port):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err}{self.log_tail()}")
            if time.monotonic() > end:
                self.kill9()
                raise TimeoutError(f"redis-server on port {self.port} did not answer within {timeout}s")
            time.sleep(0.01)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL: no shutdown save, open connections just break, like a crashed host."""
        if self.running:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, timeout: float = 10.0) -> RedisProcess:
        self.kill9()
        # The kernel may hold the listening port for a moment after the kill.
        end = time.monotonic() + timeout
        while not bindable(self.port):
            if time.monotonic() > end:
                raise TimeoutError(f"port {self.port} still busy after kill")
            time.sleep(0.01)
        return self.start(timeout)

    def stop(self) -> None:
        if self.running:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill9()
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()

    def log_tail(self, lines: int = 20) -> str:
        log = self.dir / f"redis-{self.port}.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
