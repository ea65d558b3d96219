"""Errors, and the shapes each wire format gives them.

An error made by the gateway (`ApiError` for the client's mistakes, a gateway-made
`UpstreamError` for an upstream that failed) is rendered once, at the edge, in the shape
of the route it happened on: OpenAI's `{"error": {"message", "type", "param", "code"}}`
or Anthropic's `{"type": "error", "error": {"type", "message"}}`, so that each SDK raises
its own exception classes. An upstream's own error body is passed on as it came.
"""
from __future__ import annotations

import logging

import orjson
from aiohttp import web

from gateway.upstream.sse import frame

log = logging.getLogger("detgate")


class ErrorShape:
    """OpenAI's shape; `AnthropicErrors` overrides it."""

    content_type = "application/json"

    def body(self, message: str, *, type: str, param: str | None = None, code: str | None = None,
             status: int = 400) -> bytes:
        return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})

    def frame(self, payload: bytes) -> bytes:
        """An error body as the stream event that tells a reader the stream failed."""
        return frame(payload)

    def is_error(self, payload: bytes) -> bool:
        """Whether an upstream body already is an error in this shape (passed on as it is)."""
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        return isinstance(parsed, dict) and self._is_error(parsed)

    def _is_error(self, parsed: dict) -> bool:
        return isinstance(parsed.get("error"), dict)


# Anthropic's error types by HTTP status; anything else 5xx is api_error.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    529: "overloaded_error"}


class AnthropicErrors(ErrorShape):
    def body(self, message: str, *, type: str, param: str | None = None, code: str | None = None,
             status: int = 400) -> bytes:
        kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        # Anthropic's errors carry no param or code: they are told in the message.
        detail = "".join(f" ({name}: {value})" for name, value in (("param", param), ("code", code)) if value)
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message + detail}})

    def frame(self, payload: bytes) -> bytes:
        return frame(payload, "error")

    def _is_error(self, parsed: dict) -> bool:
        return parsed.get("type") == "error"


OPENAI_ERRORS = ErrorShape()
ANTHROPIC_ERRORS = AnthropicErrors()


class ApiError(Exception):
    """A failure the client is told about; raised anywhere, rendered once in its route's shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self, shape: ErrorShape = OPENAI_ERRORS) -> bytes:
        return shape.body(self.message, type=self.type, param=self.param, code=self.code, status=self.status)

    def response(self, shape: ErrorShape = OPENAI_ERRORS) -> web.Response:
        return web.Response(status=self.status, body=self.body(shape), headers=self.headers,
                            content_type=shape.content_type)


class UpstreamError(Exception):
    """The upstream failed: its own error passed on as it came, or one the gateway words
    (unreachable, a broken stream, no valid answer). Never stored."""

    def __init__(self, status: int, body: bytes | None = None, content_type: str = "application/json",
                 headers: dict[str, str] | None = None, *, message: str = "", type: str = "upstream_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(f"upstream answered {status}")
        self.status = status  # retry.retry_reason() classifies by this attribute
        self.body = body  # the upstream's own error body; None for one the gateway words
        self.content_type = content_type
        self.headers = headers or {}
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def payload(self, shape: ErrorShape = OPENAI_ERRORS) -> bytes:
        if self.body is not None:
            return self.body
        return shape.body(self.message, type=self.type, param=self.param, code=self.code, status=self.status)

    def response(self, shape: ErrorShape = OPENAI_ERRORS) -> web.Response:
        content_type = self.content_type if self.body is not None else shape.content_type
        return web.Response(status=self.status, body=self.payload(shape), content_type=content_type)

    def frame(self, shape: ErrorShape) -> bytes:
        """This failure as an in-band stream event, for a stream whose headers have left."""
        payload = self.payload(shape)
        if not shape.is_error(payload):
            payload = shape.body(f"upstream failed with status {self.status}", type="upstream_error",
                                 status=self.status)
        return shape.frame(payload)

    @classmethod
    def unreachable(cls, upstream: str, why: str, detail: str | None = None, status: int = 502) -> UpstreamError:
        """`why` is told to the client; `detail` (a connector error's repr, naming hosts and
        ports) only to the log."""
        log.warning("upstream %r could not be reached: %s", upstream, detail or why)
        return cls(status, message=f"upstream {upstream!r} could not be reached: {why}", code="upstream_unreachable")

    @classmethod
    def broken_stream(cls, upstream: str, why: str, detail: str | None = None) -> UpstreamError:
        """`why` is told to the client; `detail` (a transport error's repr) only to the log."""
        log.warning("upstream %r broke off its stream: %s", upstream, detail or why)
        return cls(502, message=f"upstream {upstream!r} broke off its stream: {why}", code="upstream_stream_broken")
