"""`detgate cache diff`: one request body against what is recorded, as `--mode replay`
would see it: whether replay answers it (exactly, or as a turn whose tool outputs differ),
and otherwise every difference from the nearest recorded request."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import orjson
from multidict import CIMultiDict

from gateway.apis import SURFACES
from gateway.cache.recordings import Asking, Recordings, asking, outside_tool_outputs
from gateway.cache.session_store import RedisSessions
from gateway.cache.store import Store
from gateway.errors import ApiError
from gateway.ingress.auth import Tenants
from gateway.ops.drift import namespaced, pair
from gateway.policy.json_diff import differences, full
from gateway.policy.prepare import prepare
from gateway.route.cached import asked

ANSWERED, MISSED = 0, 1  # exit statuses


def route_of(body: dict) -> str:
    """The surface a body was most likely sent to, when the command is not told."""
    if "input" in body and "messages" not in body:
        return "responses"
    if "max_tokens" in body and str(body.get("model", "")).startswith("claude"):
        return "messages"
    return "chat.completions"


def header_lines(lines: list[str]) -> CIMultiDict:
    """`-H "Name: value"` arguments as the request's headers; ValueError for a malformed one."""
    headers: CIMultiDict = CIMultiDict()
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"a header is 'Name: value', not {line!r}")
        headers.add(name.strip(), value.strip())
    return headers


def rotation(secret: bytes, epochs: dict[str, int]) -> Callable[[str, str, str], str]:
    """DriftMonitor.key, from the ledger's epochs."""
    def rotated(key: str, upstream: str, model: str) -> str:
        epoch = epochs.get(pair(upstream, model))
        return namespaced(secret, key, epoch) if epoch else key
    return rotated


async def diff_request(raw: bytes, route: str | None, headers: CIMultiDict, settings, store: Store,
                       sessions: RedisSessions, secret: bytes, epochs: dict[str, int], say: Callable[[str], None]) -> int:
    """Print what replay makes of the request; its exit status. Raises ApiError for a request
    the gateway would refuse, ValueError for a body that is not JSON."""
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("the request body is not a JSON object")
    surface = SURFACES[route or route_of(body)]
    prepared = prepare(surface, raw, asked(SimpleNamespace(headers=headers), surface),
                       settings.model_copy(update={"mode": "replay"}), Tenants.from_settings(settings), secret)
    if prepared.parts is None:
        raise ApiError(400, "this request is answered in parts (n > 1 split by the profile); diff one part at a time")
    apart = surface.apart(prepared.call.body)
    recordings = Recordings(sessions, secret, rotation(secret, epochs))
    request = asking(prepared, headers, apart)
    key = recordings.key(request)
    say(f"route {surface.name}, model {prepared.model}, tenant {prepared.tenant.name}, key {key}")
    if await store.get(key) is not None:
        say("replay answers it: this exact request is recorded")
        return ANSWERED
    found = await recordings.same_but_tool_outputs(request)
    if found is not None and await store.get(found[0].key) is not None:
        turn, changed = found
        say(f"replay answers it with turn {turn.n} of session {turn.session!r}; its tool outputs differ at "
            f"{len(changed)} path(s):")
        for difference in differences(turn.document(), request.document()):
            if difference.path in changed or any(difference.path.startswith(p) for p in changed):
                say("\n".join(full(difference)))
        return ANSWERED
    return await _nearest(recordings, request, say)


async def _nearest(recordings: Recordings, request: Asking, say: Callable[[str], None]) -> int:
    near = await recordings.nearest(request)
    if near is None:
        say(f"replay misses it, and no request recorded for this tenant on {request.parts.route} with model "
            f"{request.model} is near it (requests are kept only by `detgate serve --mode record`)")
        return MISSED
    turn, sent = near.turn, request.document()
    kept = outside_tool_outputs(turn.route, turn.document(), sent)
    say(f"replay misses it; the nearest recording is turn {turn.n} of {near.place()} (key {turn.key}), "
        f"{len(kept)} difference(s) beyond tool outputs:")
    for difference in kept:
        say("\n".join(full(difference)))
    if not kept:
        say("the keyed bodies are the same apart from tool outputs: a keyed header (anthropic-version, "
            "anthropic-beta), the upstream or the strategy differs")
    return MISSED

