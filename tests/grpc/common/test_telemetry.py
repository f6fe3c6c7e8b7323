"""Tracing and logging set-up: idempotent exporters, one global provider, trace ids in handler logs
(what needs a fresh process: tests/integration/common/test_telemetry_processes.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from epd.common.channels import create_channel
from epd.common.server import ServerOptions, build_server
from epd.common.telemetry import (
    SingleLineFormatter,
    TraceContextFilter,
    add_exporter,
    configure_tracing,
)
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding


def test_same_exporter_added_twice_exports_each_span_once(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    assert add_exporter(provider, f"json:{path}") is True
    assert add_exporter(provider, f"json:{path}") is False
    assert add_exporter(provider, "none") is False
    with provider.get_tracer("t").start_as_current_span("once"):
        pass
    assert [json.loads(line)["name"] for line in path.read_text().splitlines()] == ["once"]


def test_configure_tracing_keeps_one_global_provider_and_rejects_bad_specs() -> None:
    provider = configure_tracing("epd-tests")
    assert configure_tracing("another-name") is provider
    assert trace.get_tracer_provider() is provider
    with pytest.raises(ValueError, match="json:PATH"):
        configure_tracing("epd-tests", "json:")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.addFilter(TraceContextFilter())
        self.setFormatter(SingleLineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


async def test_handler_logs_carry_the_callers_trace_id(spans) -> None:
    servicer = ScriptedEncodeService()
    demo_logger = logging.getLogger("epd.tests.handler")

    async def log_in_handler() -> None:
        demo_logger.info("releasing")

    servicer.on_release = log_in_handler
    records = _Records()
    demo_logger.addHandler(records)
    demo_logger.setLevel(logging.INFO)
    server, port = await build_server([encode_binding(servicer)], ServerOptions())
    try:
        with trace.get_tracer("test").start_as_current_span("client work") as root:
            async with create_channel(f"127.0.0.1:{port}") as channel:
                await encode_grpc.EncodeServiceStub(channel).Release(encode_pb.ReleaseRequest())
    finally:
        demo_logger.removeHandler(records)
        await server.drain_and_stop(0)
    trace_id = f"{root.get_span_context().trace_id:032x}"
    server_span = next(s for s in spans.get_finished_spans() if s.kind.name == "SERVER")
    assert records.lines and f"trace={trace_id}" in records.lines[0]
    assert f"span={server_span.context.span_id:016x}" in records.lines[0]
