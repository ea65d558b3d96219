"""Traces: one server span per request, with child spans for the cache lookup, the
single-flight lock or wait, each upstream attempt, each vote member and each schema retry;
W3C `traceparent` / `tracestate` accepted from the client and sent on to the upstream;
exported over OTLP/HTTP when `--otlp-endpoint` is set.

Off (the default) it costs the hit path nothing: the middleware and the traced store are
not installed, no tracer provider is built, and the few hooks on the miss path (in the
upstream client, the single-flight and the strategies) read one context variable and return.
On, each app has its own tracer provider, so gateways sharing a process do not mix spans.
Attributes follow OpenTelemetry's HTTP and GenAI semantic conventions where they fit
(`gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, ...) and are
`detgate.*` for what is the gateway's own (cache result, key prefix, tenant, attempts).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Awaitable, Iterator, TypeVar
from urllib.parse import urlsplit

import orjson

T = TypeVar("T")

# The tracing of the app serving the current request; None when tracing is off.
CURRENT: contextvars.ContextVar[Tracing | None] = contextvars.ContextVar("detgate_tracing", default=None)

# GenAI operation names by API path (below /v1).
OPERATIONS = {"/chat/completions": "chat", "/completions": "text_completion", "/embeddings": "embeddings",
              "/responses": "chat", "/messages": "chat"}
PROVIDERS = {"openai": "openai", "anthropic": "anthropic"}  # profile -> gen_ai.provider.name
KEY_PREFIX_CHARS = 16


class Tracing:
    """An app's tracer provider, exporter and propagator (needs the [otel] extra)."""

    def __init__(self, endpoint: str, service: str = "detgate-gateway") -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        traces = endpoint.rstrip("/")
        if not traces.endswith("/v1/traces"):  # a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it
            traces += "/v1/traces"
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces),
                                                            schedule_delay_millis=1000))
        self.tracer = self.provider.get_tracer("detgate")
        self.propagator = TraceContextTextMapPropagator()
        self.in_context = trace.set_span_in_context

    def shutdown(self) -> None:
        """Flush what is still queued, then stop exporting."""
        self.provider.shutdown()


def middleware(tracing: Tracing):
    """The server span of each request, child of the client's `traceparent` when it sent one."""
    from aiohttp import web
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from gateway.ops.watch import UPSTREAM
    from gateway.state import CACHE, KEY, MODEL, TENANT

    @web.middleware
    async def traced(request: web.Request, handler) -> web.StreamResponse:
        parent = tracing.propagator.extract(request.headers)
        token = CURRENT.set(tracing)
        route = request.match_info.route
        path = route.resource.canonical if route.resource is not None else request.path
        with tracing.tracer.start_as_current_span(f"{request.method} {path}", context=parent, kind=SpanKind.SERVER,
                                                  attributes={"http.request.method": request.method,
                                                              "url.path": request.path, "http.route": path}) as span:
            status, response = 500, None
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                CURRENT.reset(token)
                span.set_attribute("http.response.status_code", status)
                operation = OPERATIONS.get(request.path.removeprefix("/v1"))
                found = {"gen_ai.operation.name": operation, "gen_ai.request.model": request.get(MODEL),
                         "detgate.cache": request.get(CACHE), "detgate.tenant": request.get(TENANT),
                         "detgate.upstream": request.get(UPSTREAM),
                         "detgate.key_prefix": (request.get(KEY) or "")[:KEY_PREFIX_CHARS] or None}
                if response is not None:  # what only the answer's headers say: attempts and votes
                    attempts, votes = response.headers.get("x-detgate-attempts"), response.headers.get("x-detgate-votes")
                    found["detgate.attempts"] = int(attempts) if attempts and attempts.isdigit() else None
                    found["detgate.votes"] = votes
                span.set_attributes({k: v for k, v in found.items() if v is not None})
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))

    return traced


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any] | None = None) -> Iterator[Any]:
    """A child span of the current one while the block runs; nothing when tracing is off."""
    tracing = CURRENT.get()
    if tracing is None:
        yield None
        return
    with tracing.tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


async def traced(name: str, work: Awaitable[T], attributes: dict[str, Any] | None = None) -> T:
    with span(name, attributes):
        return await work


def start(name: str, attributes: dict[str, Any] | None = None) -> Any:
    """A child span of the current one, ended by `end`; None when tracing is off."""
    tracing = CURRENT.get()
    return None if tracing is None else tracing.tracer.start_span(name, attributes=attributes)


def end(started: Any, attributes: dict[str, Any] | None = None) -> None:
    if started is not None:
        if attributes:
            started.set_attributes(attributes)
        started.end()


def waiting(task: Any, key: str) -> None:
    """A span for a request that joined another's fill in this process, ended when it lands."""
    started = start("detgate.singleflight.wait", {"detgate.key_prefix": key[:KEY_PREFIX_CHARS]})
    if started is not None:
        task.add_done_callback(lambda _: started.end())


def member(work: Awaitable[T], seed: int, vote: int) -> Awaitable[T]:
    """`work`, as the span of one vote member when there is a vote and tracing is on."""
    if vote <= 1 or CURRENT.get() is None:
        return work
    return traced("detgate.vote.member", work, {"detgate.seed": seed})


def schema_attempt(work: Awaitable[T], attempt: int, checked: bool) -> Awaitable[T]:
    """`work`, as the span of one schema-checked attempt (1-based) when tracing is on."""
    if not checked or CURRENT.get() is None:
        return work
    return traced("detgate.schema.attempt", work, {"detgate.attempt": attempt + 1})


def upstream_attempt(upstream: Any, path: str, data: bytes) -> Any:
    """The span of one upstream HTTP attempt (GenAI client span); None when tracing is off."""
    tracing = CURRENT.get()
    if tracing is None:
        return None
    from opentelemetry.trace import SpanKind

    operation = OPERATIONS.get(path, "chat")
    try:
        model = orjson.loads(data).get("model")
    except (orjson.JSONDecodeError, AttributeError):
        model = None
    attributes = {"gen_ai.operation.name": operation, "detgate.upstream": upstream.name,
                  "server.address": urlsplit(upstream.url).hostname or ""}
    if model:
        attributes["gen_ai.request.model"] = str(model)
    if upstream.profile in PROVIDERS:
        attributes["gen_ai.provider.name"] = PROVIDERS[upstream.profile]
    return tracing.tracer.start_span(f"{operation} {model or upstream.name}", kind=SpanKind.CLIENT,
                                     attributes=attributes)


def inject(started: Any, headers: dict[str, str]) -> dict[str, str]:
    """`headers` with the W3C trace context of `started` (the upstream sees our attempt as its parent)."""
    if started is None:
        return headers
    tracing = CURRENT.get()
    if tracing is not None:
        tracing.propagator.inject(headers, context=tracing.in_context(started))
    return headers


def end_attempt(started: Any, status: int) -> None:
    if started is not None:
        started.set_attribute("http.response.status_code", status)
        if status >= 400:
            from opentelemetry.trace import Status, StatusCode
            started.set_status(Status(StatusCode.ERROR))
        started.end()
