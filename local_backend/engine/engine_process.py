"""The engine in a process of its own, as the server runs it.

In one interpreter, the engine's host work between GPU steps (scheduling, staging, launches)
waited for the GIL behind the HTTP handlers' per-token work; at 256 streams that was most of
a step's host time (bench/results/backend_process_ab.md). Here the two run on separate
cores. The process is spawned, not forked (a forked CUDA context is unusable); commands and
lots travel pickled through one duplex pipe, each lot once per step.
"""
from __future__ import annotations

import logging
import multiprocessing
import signal
import threading

from local_backend.config import EngineConfig
from local_backend.errors import CheckpointError

STOP_SECONDS = 30


class EngineProcess:
    def __init__(self, config: EngineConfig, log_format: str):
        """Start the engine and wait until it has loaded: raises CheckpointError for a checkpoint
        it cannot serve, RuntimeError if it died loading (its traceback is in the log)."""
        self.config = config
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=serve, args=(config, child, logging.getLogger().level, log_format),
                                        name="detgate-engine", daemon=True)
        self._process.start()
        child.close()
        self._stopping = False
        self._loop = None
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(f"the engine process exited with code {self._process.exitcode} while loading") from None
        if kind == "failed":
            self._process.join()
            raise CheckpointError(payload)
        self.info = payload

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def start(self, loop, deliver, died) -> None:
        """Lots are read on the event loop as they arrive: no thread of this process waits for the
        GIL to hand them over while the handlers hold it."""
        def read():
            try:
                lot = self._conn.recv()
            except (EOFError, OSError):
                loop.remove_reader(self._conn.fileno())
                if not self._stopping:
                    died("the engine process exited")
                return
            deliver(lot)

        self._loop = loop
        loop.add_reader(self._conn.fileno(), read)

    def send(self, command: tuple) -> None:
        try:
            self._conn.send(command)
        except OSError:   # the process is gone: the loop saw its pipe close, and failed the waiting requests
            pass

    def was_read(self) -> None:
        self.send(("read",))

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self.send(("stop",))
        self._process.join(STOP_SECONDS)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        if self._loop is None:
            self._conn.close()
        else:   # the loop watches the pipe: it alone may close it
            self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        if not self._conn.closed:
            self._loop.remove_reader(self._conn.fileno())
            self._conn.close()


def serve(config: EngineConfig, conn, log_level: int, log_format: str) -> None:
    """The engine process: load, say so, then run the loop until told to stop or the server is gone."""
    # Ctrl-C reaches the terminal's whole process group; the server stops this process in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=log_format)   # a spawned process starts unconfigured
    from local_backend.engine.llm_engine import Engine   # torch: only in this process
    try:
        engine = Engine(config)
    except CheckpointError as e:
        conn.send(("failed", str(e)))
        return
    conn.send(("ready", engine.info()))
    threading.Thread(target=_commands, args=(conn, engine), name="detgate-commands", daemon=True).start()
    try:
        engine.run(conn.send)
    except (BrokenPipeError, ConnectionResetError):   # the server is gone; nobody is left to tell
        pass


def _commands(conn, engine) -> None:
    while True:
        try:
            command = conn.recv()
        except (EOFError, OSError):   # the server is gone
            engine.command(("stop",))
            return
        if command[0] == "read":
            engine.outbox.was_read()
        else:
            engine.command(command)
