"""Serve modes for golden-record CI: `record` always calls upstream and overwrites,
`replay` answers from the cache only and never calls an upstream.

A replay miss is a 404 (like `x-detgate-cache-control: only-if-cached`): the request is
valid, there is just nothing recorded for it. The message names the key and shows the
request as it was keyed, so a test that changed its prompt can see what changed.
"""
from __future__ import annotations

import orjson

from gateway.errors import ApiError

HINT_CHARS = 400

# What each mode makes of every request's x-detgate-cache-control.
MODE_CONTROLS = {"record": "no-cache", "replay": "only-if-cached"}

_TRANSPORT = ("stream", "stream_options")  # sent upstream, but not part of the key


def replay_unavailable(headers: dict[str, str]) -> ApiError:
    """The store is down: replay can answer nothing, and must not fall back to the upstream."""
    return ApiError(503, "Replay mode: the cache store is unavailable, and replay never calls an upstream. "
                         "Retry once the store is back.", type="server_error", code="cache_unavailable",
                    headers={**headers, "Retry-After": "1"})


def replay_miss(key: str, sent: dict, headers: dict[str, str]) -> ApiError:
    keyed = {k: v for k, v in sent.items() if k not in _TRANSPORT}
    text = orjson.dumps(keyed, option=orjson.OPT_SORT_KEYS).decode()
    hint = text if len(text) <= HINT_CHARS else f"{text[:HINT_CHARS]}... ({len(text)} characters)"
    return ApiError(404, f"Replay mode: nothing is recorded for key {key}; record it with `detgate serve --mode "
                         f"record` or `detgate cache import`. The request as keyed: {hint}",
                    code="replay_miss", headers={**headers, "x-detgate-cache": "miss"})
