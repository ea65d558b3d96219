"""A real OTLP/HTTP trace receiver, in process: it decodes each protobuf export request with
OpenTelemetry's own generated types and keeps the spans, as a collector would receive them."""
from __future__ import annotations

import gzip
import threading

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.requests = 0
        self._lock = threading.Lock()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        return app

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert request.content_type == "application/x-protobuf", request.content_type
        export = ExportTraceServiceRequest.FromString(body)
        with self._lock:
            self.requests += 1
            for resource in export.resource_spans:
                service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name")
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append({
                            "name": span.name, "service": service, "kind": span.kind,
                            "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex() or None,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "trace_state": span.trace_state, "status": span.status.code,
                            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                        })
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")
