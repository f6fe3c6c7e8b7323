"""``scripts/scheduler.sh`` as a real process: serves, reflects, drains on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "scheduler.sh"


def start(*flags: str) -> tuple[subprocess.Popen[str], int]:
    env_venv = str(Path(sys.executable).parents[1])
    process = subprocess.Popen(
        ["bash", str(SCRIPT), "--port", "0", *flags],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"EPD_VENV": env_venv, "PATH": "/usr/bin:/bin"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"listening on [^:]+:(\d+)", line)
    assert match, (line, process.stderr.read() if process.poll() is not None else "")
    return process, int(match.group(1))


def test_scheduler_process_serves_reflects_and_drains() -> None:
    process, port = start("--split-ratio", "8:1")
    with process:  # NOTE: closes its pipes
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=10
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
                assert "epd.v1.SchedulerService" in services
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
        finally:
            process.kill()


def test_bad_flags_fail_with_a_message_not_a_traceback() -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--split-ratio", "8:x"],
        text=True,
        capture_output=True,
        timeout=60,
        env={"EPD_VENV": str(Path(sys.executable).parents[1]), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "split ratio" in result.stderr and "Traceback" not in result.stderr
