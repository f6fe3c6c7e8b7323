"""``scripts/encode.sh`` as a real process: serves the tiny model, drains on SIGTERM."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image

from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "encode.sh"
ENV = {
    "EPD_VENV": str(Path(sys.executable).parents[1]),
    "PATH": "/usr/bin:/bin",
    "HF_HUB_OFFLINE": "1",
}


def test_encode_process_serves_and_drains(tiny_model_dir: Path) -> None:
    process = subprocess.Popen(
        [
            "bash",
            str(SCRIPT),
            "--model",
            str(tiny_model_dir),
            "--port",
            "0",
            "--transfer",
            "inline",
        ],
        text=True,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with process:  # NOTE: closes its pipes
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            match = re.search(r"listening on [^:]+:(\d+)", line)
            assert match, line + (process.stderr.read() if process.poll() is not None else "")
            buffer = io.BytesIO()
            Image.new("RGB", (56, 56), (10, 200, 30)).save(buffer, format="PNG")
            with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
                health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert health.status == health_pb2.HealthCheckResponse.SERVING
                request = pb.EncodeRequest(items=[multimodal_pb2.MediaItem(data=buffer.getvalue())])
                (response,) = list(pb_grpc.EncodeServiceStub(channel).Encode(request, timeout=60))
                assert response.embeddings.byte_size == 4 * 128 * response.embeddings.shape[0]
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            process.kill()


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--model", str(tmp_path)],
        text=True,
        capture_output=True,
        env=ENV,
        timeout=120,
    )
    assert result.returncode == 2
    assert "not a model directory" in result.stderr and "Traceback" not in result.stderr
