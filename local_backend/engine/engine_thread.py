"""The engine on a thread of the server's process: tests reach into it (its scheduler, its
runner), and benchmarks drive it. Its loop shares the GIL with the HTTP handlers."""
from __future__ import annotations

import threading

from local_backend.engine.llm_engine import Engine


class EngineThread:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.config, self.info = engine.config, engine.info()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, loop, deliver, died) -> None:
        def run():
            try:
                self.engine.run(lambda lot: loop.call_soon_threadsafe(deliver, lot))
            except BaseException:
                loop.call_soon_threadsafe(died, "the engine thread failed")
                raise

        self._thread = threading.Thread(target=run, name="detgate-engine", daemon=True)
        self._thread.start()

    def send(self, command: tuple) -> None:
        self.engine.command(command)

    def was_read(self) -> None:
        self.engine.outbox.was_read()

    def stop(self) -> None:
        if self._thread is not None:
            self.engine.command(("stop",))
            self._thread.join()
            self._thread = None
