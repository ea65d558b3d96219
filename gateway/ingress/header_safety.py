"""Response headers that cannot break the response, and that say how the cache took part.

Some header values carry text the gateway does not control: the model name an upstream
answered with, warnings that quote request values. A control character in one makes
aiohttp refuse to send the headers, and the client's connection just drops. Such values
are percent-encoded instead, so the response always goes out.

Every response also carries x-detgate-cache, as README promises: a route that set no
label (the proxy, health, an error before any lookup) did not use the cache.
"""
from __future__ import annotations

import re
from urllib.parse import quote

from aiohttp import web

from gateway.state import CACHE

# What HTTP forbids in a field value (RFC 9110 5.5): controls other than tab, and DEL.
_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def header_safe(value: str) -> str:
    if _FORBIDDEN.search(value) is None:
        return value
    return _FORBIDDEN.sub(lambda m: quote(m.group(0)), value)


async def finish_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: runs just before any response's headers are sent. One hook, and
    one scan of all values at once, since it runs on every cache hit."""
    headers = response.headers
    headers.setdefault("x-detgate-cache", request.get(CACHE, "bypass"))
    if _FORBIDDEN.search("".join(headers.values())) is None:
        return
    unsafe = [(name, value) for name, value in headers.items() if _FORBIDDEN.search(value) is not None]
    for name, value in unsafe:
        headers[name] = header_safe(value)
