"""Log records carry the trace and span ids of the current span."""

from __future__ import annotations

import logging

from opentelemetry.sdk.trace import TracerProvider

from epd.common.telemetry import LOG_FORMAT, TraceContextFilter


def _format(record: logging.LogRecord) -> str:
    TraceContextFilter().filter(record)
    return logging.Formatter(LOG_FORMAT).format(record)


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("epd.test", logging.INFO, __file__, 1, message, None, None)


def test_log_line_outside_a_span_has_placeholders() -> None:
    line = _format(_record("no span"))
    assert "trace=- span=-" in line and line.endswith("no span")


def test_log_line_inside_a_span_carries_its_ids() -> None:
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("work") as span:
        line = _format(_record("inside"))
        context = span.get_span_context()
    assert f"trace={context.trace_id:032x}" in line
    assert f"span={context.span_id:016x}" in line
