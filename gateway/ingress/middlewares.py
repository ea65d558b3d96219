"""Middlewares: every failure in its route's error shape; every request measured and logged once."""
from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from gateway.apis import SURFACES
from gateway.errors import OPENAI_ERRORS, ApiError, ErrorShape
from gateway.state import ACCESS_LOG, CACHE, KEY, LATE_WARNINGS, METRICS, MODEL, TENANT

log = logging.getLogger("detgate")

_TYPES = {401: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def shape_of(request: web.Request) -> ErrorShape:
    """The error shape of the surface a request was routed to, or whose path it is below
    (Anthropic's /v1/messages/count_tokens, proxied); OpenAI's elsewhere."""
    surface = SURFACES.get(request.match_info.route.name or "")
    if surface is None:
        surface = next((s for s in SURFACES.values() if request.path.startswith(f"/v1{s.path}/")), None)
    return surface.errors if surface is not None else OPENAI_ERRORS


@web.middleware
async def errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response(shape_of(request))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
        shape = shape_of(request)
        body = shape.body(f"{exc.reason}: {request.method} {request.path}" if exc.status in (404, 405) else exc.text or exc.reason,
                          type=_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "server_error"),
                          code=exc.reason.lower().replace(" ", "_"), status=exc.status)
        return web.Response(status=exc.status, body=body, headers=headers, content_type=shape.content_type)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        shape = shape_of(request)
        return web.Response(status=500, content_type=shape.content_type,
                            body=shape.body("The gateway failed to handle this request; the failure is logged.",
                                            type="server_error", code="internal_error", status=500))


@web.middleware
async def observe(request: web.Request, handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    started = time.perf_counter()
    metrics.in_flight += 1
    status = 500
    warnings = None
    try:
        response = await handler(request)
        status = response.status
        warnings = response.headers.get("x-detgate-warnings")
        return response
    finally:
        elapsed = time.perf_counter() - started
        metrics.in_flight -= 1
        route = request.match_info.route.name or "unmatched"
        cache = request.get(CACHE, "bypass")
        model = request.get(MODEL, "")
        metrics.observe_request(route, model, cache, str(status), elapsed)
        access = request.app[ACCESS_LOG]
        if access.stream is not None:  # the line is not even built when access logging is off
            fields = {"method": request.method, "path": request.path, "status": status, "route": route,
                      "model": model, "cache": cache, "key": request.get(KEY), "tenant": request.get(TENANT),
                      "ms": round(elapsed * 1000, 3)}
            warned = "; ".join(filter(None, (warnings, request.get(LATE_WARNINGS))))
            if warned:
                fields["warnings"] = warned
            access.write(fields)
