"""Tracing and logging set-up: idempotent exporters, one-line logs, trace ids in handler logs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from epd.server.common.channels import create_channel
from epd.server.common.server import ServerOptions, build_server
from epd.server.common.telemetry import (
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


_TRACED_ONLY_AFTER_EXPORT = """
import asyncio, sys
from epd.server.common.channels import create_channel
from epd.server.common.server import build_server
from epd.server.common.telemetry import configure_tracing, traces_rpcs
from epd.v1 import encode_service_pb2 as pb, encode_service_pb2_grpc as pb_grpc
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding

async def release_through_new_server_and_channel(request_id):
    server, port = await build_server([encode_binding(ScriptedEncodeService())])
    async with create_channel(f"127.0.0.1:{port}") as channel:
        await pb_grpc.EncodeServiceStub(channel).Release(pb.ReleaseRequest(lease_ids=[request_id]))
    await server.drain_and_stop(0)

async def main():
    seen = [traces_rpcs()]
    configure_tracing("t", "none")
    seen.append(traces_rpcs())
    await release_through_new_server_and_channel("untraced")
    configure_tracing("t", "json:" + sys.argv[1])
    seen.append(traces_rpcs())
    await release_through_new_server_and_channel("traced")
    print(seen)

asyncio.run(main())
"""


def test_rpcs_are_traced_only_when_spans_go_somewhere(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    result = subprocess.run([sys.executable, "-c", _TRACED_ONLY_AFTER_EXPORT, str(path)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[False, False, True]"
    kinds = sorted(json.loads(line)["kind"] for line in path.read_text().splitlines()
                   if json.loads(line)["name"] == "/epd.v1.EncodeService/Release")  # fmt: skip
    assert kinds == ["SpanKind.CLIENT", "SpanKind.SERVER"]


def test_configure_logging_writes_one_line_per_record_with_traceback() -> None:
    script = (
        "import logging\n"
        "from epd.server.common.telemetry import configure_logging\n"
        "configure_logging('info')\n"
        "configure_logging('info')\n"  # NOTE: twice, to show lines are not duplicated
        "logging.getLogger('epd.demo').debug('hidden')\n"
        "try:\n    raise KeyError('boom')\n"
        "except KeyError:\n    logging.getLogger('epd.demo').exception('failed\\nbadly')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True, timeout=60)  # fmt: skip
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert " ERROR epd.demo trace=- span=- failed\\nbadly\\nTraceback" in lines[0]
    assert "KeyError: 'boom'" in lines[0]


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
