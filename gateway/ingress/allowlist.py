"""What the uncached proxy may pass on: paths confined below /v1, and an allow-list per upstream.

A rule is "METHOD /path" below the upstream's base URL, e.g. "GET /models" or
"DELETE /responses/{id}"; `{name}` stands for exactly one path segment, the id of an
object the upstream keeps, which a tenant may name only if it owns it (gateway/ingress/proxy.py). A request's
path is taken apart from its raw bytes, segment by segment, so that nothing a client
encodes (`%2e%2e`, `%2f`, a backslash, a doubled slash) can make the forwarded path mean
more than the segments a rule matched: such a path is refused before any upstream call.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes

from gateway.errors import ApiError

PREFIX = "/v1/"

# Without a `proxy` list, an upstream proxies what the clients of its profile's wire
# (gateway/upstream/wires.py) need beyond the cached routes, and nothing that an upstream
# keeps per account: the model listing, and Anthropic's token count.
WIRE_DEFAULTS: dict[str, tuple[str, ...]] = {
    "openai": ("GET /models",),
    "anthropic": ("GET /models", "POST /messages/count_tokens"),
}

_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_SEGMENT = re.compile(r"^(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z0-9._~:@-]+)$")
_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Rule:
    method: str
    parts: tuple[str | None, ...]  # a literal segment, or None for a `{name}`

    def matches(self, method: str, segments: tuple[str, ...]) -> bool:
        return method == self.method and len(segments) == len(self.parts) and all(
            part is None or part == segment for part, segment in zip(self.parts, segments))

    def named(self, segments: tuple[str, ...]) -> tuple[str, ...]:
        """The ids a matching path names: the segments its `{name}`s stand for."""
        return tuple(segment for part, segment in zip(self.parts, segments) if part is None)


def parse_rule(spec: str) -> Rule:
    """Raises ValueError naming what is wrong, so a bad config refuses to start."""
    method, _, path = spec.strip().partition(" ")
    path = path.strip()
    if method.upper() not in _METHODS:
        raise ValueError(f"proxy rule {spec!r}: the method must be one of {', '.join(_METHODS)}")
    segments = path.split("/")[1:] if path.startswith("/") else []
    if not segments or not all(_SEGMENT.match(s) and s not in (".", "..") for s in segments):
        raise ValueError(f"proxy rule {spec!r}: the path must be /segment/... below the upstream's base URL "
                         "(letters, digits, -._~:@, or {name} for any one segment)")
    return Rule(method.upper(), tuple(None if s.startswith("{") else s for s in segments))


@lru_cache(maxsize=None)  # a few upstreams, asked on every proxied request
def rules_for(wire: str, configured: tuple[str, ...] | None) -> tuple[Rule, ...]:
    return tuple(parse_rule(spec) for spec in (WIRE_DEFAULTS[wire] if configured is None else configured))


def confined(raw_target: str) -> tuple[str, ...]:
    """The decoded segments below /v1 of a request target as it came on the wire; a 404 for
    anything that is not plainly a path below /v1 (a dot segment, an encoded slash or
    backslash, an empty segment, a control character, a bad escape)."""
    path = raw_target.partition("?")[0].partition("#")[0]
    segments = []
    if path.startswith(PREFIX):
        for raw in path[len(PREFIX):].split("/"):
            if _ESCAPE.search(raw.encode()):
                break
            try:
                segment = unquote_to_bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                break
            if segment in ("", ".", "..") or any(c in "/\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in segment):
                break
            segments.append(segment)
        else:
            return tuple(segments)
    raise ApiError(404, "Not Found: this path is not one the gateway serves or proxies.", code="not_found")


def encoded(segments: tuple[str, ...]) -> str:
    """The path sent upstream, each segment escaped whole, so that none can act as a separator."""
    return "/" + "/".join(quote(segment, safe="") for segment in segments)
