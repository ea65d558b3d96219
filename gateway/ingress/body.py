"""Reading a request's body: with the size cap, and a 4xx for a body its headers misdescribe."""
from __future__ import annotations

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from gateway.errors import ApiError


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, f"The request body is larger than this gateway accepts ({exc.text}).",
                       code="request_too_large") from None
    except RequestPayloadError:
        # e.g. "Content-Encoding: gzip" on a body that is not gzip
        raise ApiError(400, "The request body could not be read as its headers describe it "
                            "(Content-Encoding or framing).", code="invalid_body") from None
