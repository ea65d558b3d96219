"""Errors as OpenAI's wire format has them: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import orjson
from aiohttp import web


class ApiError(Exception):
    """A failure the client is told about in OpenAI's shape; raised anywhere, rendered once."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=self.body(), headers=self.headers, content_type="application/json")


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


class UpstreamError(Exception):
    """The upstream answered with an error (or broke off): passed on as it came, never stored."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json",
                 headers: dict[str, str] | None = None):
        super().__init__(f"upstream answered {status}")
        self.status = status  # retry.retry_reason() classifies by this attribute
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=self.body, content_type=self.content_type)

    @classmethod
    def unreachable(cls, upstream: str, why: str, status: int = 502) -> UpstreamError:
        message = f"upstream {upstream!r} could not be reached: {why}"
        return cls(status, error_body(message, type="upstream_error", code="upstream_unreachable"))

    @classmethod
    def broken_stream(cls, upstream: str, why: str) -> UpstreamError:
        message = f"upstream {upstream!r} broke off its stream: {why}"
        return cls(502, error_body(message, type="upstream_error", code="upstream_stream_broken"))
