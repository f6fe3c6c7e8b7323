"""HTTP requests get a SERVER span that continues the caller's W3C trace context."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epd.common.http_tracing import tracing_middleware

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


async def answer(request: web.Request) -> web.Response:
    trace.get_current_span().set_attribute("epd.request_id", request.headers["X-Request-Id"])
    return web.json_response({"ok": True})


async def fail(request: web.Request) -> web.Response:
    return web.json_response({"error": "boom"}, status=503)


async def test_a_request_span_continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    app = web.Application(middlewares=[tracing_middleware])
    app.add_routes([web.post("/v1/chat/completions", answer), web.get("/fail", fail)])
    async with TestClient(TestServer(app)) as client:
        response = await client.post(
            "/v1/chat/completions",
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-Id": "r1"},
        )
        assert response.status == 200
        assert (await client.get("/fail")).status == 503
    first, second = spans.get_finished_spans()
    assert first.name == "POST /v1/chat/completions" and first.kind is trace.SpanKind.SERVER
    assert first.context is not None and first.parent is not None
    assert f"{first.context.trace_id:032x}" == TRACE_ID
    assert f"{first.parent.span_id:016x}" == PARENT_ID
    assert first.attributes is not None and first.attributes["epd.request_id"] == "r1"
    assert first.attributes["http.response.status_code"] == 200
    assert second.parent is None and second.status.status_code is trace.StatusCode.ERROR
