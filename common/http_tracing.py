"""A SERVER span per HTTP request (the route's OpenAI front), joined to the caller's trace.

The trace context comes from the request's W3C ``traceparent``/``tracestate`` headers (a new
trace starts when there are none); the route's gRPC calls made while handling the request are
its children, so an HTTP request makes the same span tree across services as a gRPC one.

Hand-written because opentelemetry-instrumentation-aiohttp-server has no release matching the
OpenTelemetry 1.45.2 / 0.66b2 set the gRPC instrumentation pins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from opentelemetry import propagate, trace

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_tracer = trace.get_tracer(__name__)


@web.middleware
async def tracing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Run ``handler`` inside a SERVER span named ``METHOD /path``."""
    context = propagate.extract(dict(request.headers))
    name = f"{request.method} {request.path}"
    with _tracer.start_as_current_span(name, context=context, kind=trace.SpanKind.SERVER) as span:
        span.set_attribute("http.request.method", request.method)
        span.set_attribute("url.path", request.path)
        try:
            response = await handler(request)
        except web.HTTPException as e:
            span.set_attribute("http.response.status_code", e.status)
            raise
        span.set_attribute("http.response.status_code", response.status)
        if response.status >= 500:
            span.set_status(trace.StatusCode.ERROR)
        return response
