"""``scripts/prefill.sh`` as a real process: warm engine -> SERVING, SIGTERM -> clean exit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.vllm
SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "prefill.sh"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def alive(pids: list[int]) -> list[int]:
    """The pids still running (zombies count as gone)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
        except OSError:
            continue
    return running


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def test_prefill_process_serves_when_warm_and_stops_cleanly(tiny_model_dir, session_tmp) -> None:
    env = {**os.environ, "EPD_VENV": str(Path(sys.executable).parents[1])}
    process = subprocess.Popen(["bash", str(SCRIPT), "--model", str(tiny_model_dir), "--port", "0",
                                "--kv-cache-mb", "64"], text=True, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert process.stdout is not None
        match = None
        for line in process.stdout:
            if match := re.search(r"epd prefill listening on [^:]+:(\d+)", line):
                break
        assert match, f"no listening line (exit {process.poll()})"
        engine_processes = children_of(process.pid)
        assert engine_processes, "vLLM's EngineCore should run as a child process"
        with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                              timeout=10)  # fmt: skip
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        deadline = time.monotonic() + 15
        while alive(engine_processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(engine_processes), [describe(pid) for pid in alive(engine_processes)]
    finally:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
