"""Serve modes for golden-record CI: `record` always calls upstream and overwrites,
`replay` answers from the cache only and never calls an upstream.

A replay miss is a 400 `invalid_request_error` on every wire, with code `replay_miss`: a
status an agent shows its user and does not retry (Claude Code reads a 404 as "an issue
with the selected model", Codex and the openai SDK retry a 5xx or 429). The message says
which recorded request is nearest and the first JSON path where they differ; with no
recording to compare, it shows the request as it was keyed.
"""
from __future__ import annotations

import orjson

from gateway.errors import ApiError

HINT_CHARS = 400

# What each mode makes of every request's x-detgate-cache-control.
MODE_CONTROLS = {"record": "no-cache", "replay": "only-if-cached"}

_TRANSPORT = ("stream", "stream_options")  # sent upstream, but not part of the key
_RECORD = "record it with `detgate serve --mode record` or `detgate cache import`"


def replay_unavailable(headers: dict[str, str]) -> ApiError:
    """The store is down: replay can answer nothing, and must not fall back to the upstream."""
    return ApiError(503, "Replay mode: the cache store is unavailable, and replay never calls an upstream. "
                         "Retry once the store is back.", type="server_error", code="cache_unavailable",
                    headers={**headers, "Retry-After": "1"})


def replay_miss(key: str, sent: dict, headers: dict[str, str], nearest: str | None = None,
                path: str | None = None) -> ApiError:
    """`nearest`: what the nearest recording is and where it differs (the route's words);
    `path`: that first differing path, as the error's param."""
    if nearest is None:
        keyed = {k: v for k, v in sent.items() if k not in _TRANSPORT}
        text = orjson.dumps(keyed, option=orjson.OPT_SORT_KEYS).decode()
        hint = text if len(text) <= HINT_CHARS else f"{text[:HINT_CHARS]}... ({len(text)} characters)"
        detail = f"No request recorded in a session is near it. The request as keyed: {hint}"
    else:
        detail = f"{nearest} `detgate cache diff` prints every difference."
    return ApiError(400, f"Replay mode: nothing is recorded for this request (key {key}); {_RECORD}. {detail}",
                    param=path, code="replay_miss", headers={**headers, "x-detgate-cache": "miss"})
