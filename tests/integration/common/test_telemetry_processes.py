"""Tracing and logging set-up in a fresh process each: RPCs are traced only once spans go somewhere,
and logs are one line per record, tracebacks included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_TRACED_ONLY_AFTER_EXPORT = """
import asyncio, sys
from epd.common.channels import create_channel
from epd.common.server import build_server
from epd.common.telemetry import configure_tracing, traces_rpcs
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
    result = subprocess.run(
        [sys.executable, "-c", _TRACED_ONLY_AFTER_EXPORT, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[False, False, True]"
    kinds = sorted(
        json.loads(line)["kind"]
        for line in path.read_text().splitlines()
        if json.loads(line)["name"] == "/epd.v1.EncodeService/Release"
    )
    assert kinds == ["SpanKind.CLIENT", "SpanKind.SERVER"]


def test_configure_logging_writes_one_line_per_record_with_traceback() -> None:
    script = (
        "import logging\n"
        "from epd.common.telemetry import configure_logging\n"
        "configure_logging('info')\n"
        "configure_logging('info')\n"  # NOTE: twice, to show lines are not duplicated
        "logging.getLogger('epd.demo').debug('hidden')\n"
        "try:\n    raise KeyError('boom')\n"
        "except KeyError:\n    logging.getLogger('epd.demo').exception('failed\\nbadly')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert " ERROR epd.demo trace=- span=- failed\\nbadly\\nTraceback" in lines[0]
    assert "KeyError: 'boom'" in lines[0]
