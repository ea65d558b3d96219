"""The `Expect` request header, answered in OpenAI's error shape.

aiohttp's own handler fails with a 500 on an Expect value that is not UTF-8 (it puts the
value in its error text); this one never echoes the value.
"""
from __future__ import annotations

from aiohttp import HttpVersion11, web

from gateway.errors import ApiError


async def expect_continue(request: web.Request) -> web.Response | None:
    """Run before the handler when a request carries Expect; None lets the request go on."""
    if request.version != HttpVersion11:
        return None
    if request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the response body's size
        return None
    return ApiError(417, "The only Expect this gateway answers is 100-continue.", param="Expect",
                    code="expectation_failed").response()
