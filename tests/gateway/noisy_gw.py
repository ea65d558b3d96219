"""A NoisyUpstream and a gateway in front of it, both over real loopback HTTP."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from prometheus_client import generate_latest

from fakes.loopback import LoopbackServer
from fakes.noisy_upstream import NoisyUpstream
from gateway.app import create_app
from gateway.config import Settings
from gateway.state import METRICS
from gw_http import SECRET

QUESTION = [{"role": "user", "content": "Is Paris in France? Answer in JSON."}]
ANSWER = {"json_pointer": "/answer"}
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                                  "note": {"type": "string"}},
                 "required": ["answer"]}


@contextmanager
def noisy_gateway(fake: NoisyUpstream, upstream: dict | None = None, **overrides) -> Iterator[LoopbackServer]:
    """The gateway routes every model to `fake`: upstream "noisy", with `upstream`'s extra
    fields (profile, mode); `overrides` are more settings."""
    with LoopbackServer(fake.app()) as server:
        config = {"name": "noisy", "url": f"{server.url}/v1", **(upstream or {})}
        values = {"upstreams": [config], "secret": SECRET, "log_level": "WARNING", **overrides}
        with LoopbackServer(create_app(Settings.model_validate(values))) as gw:
            yield gw


def metric(gw: LoopbackServer, line_start: str) -> float:
    """The value of the one sample whose line starts with `line_start` (0 when absent)."""
    for line in generate_latest(gw.app[METRICS].registry).decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
