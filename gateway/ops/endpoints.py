"""The gateway's own endpoints: health, and metrics (behind the operator token when one is set)."""
from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.ingress.auth import authorize_operator
from gateway.state import METRICS, TENANTS


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    authorize_operator(request.headers.get("Authorization"), request.app[TENANTS])
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
