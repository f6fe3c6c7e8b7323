"""Services started with ``--model ORG/NAME``: the model comes from the hub cache, offline, and
clients name it by its hub id; an id the cache lacks is a one-line usage error. (``epd up`` of a
hub id is in ``tests/integration/install/test_wheel.py``, on the installed wheel.)"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from PIL import Image

from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.hub_cache import place_in_hub_cache

REPO_ID = "epd-test/tiny-qwen2-vl"
COMMIT = "c" * 40


@pytest.fixture
def hub_env(tiny_model_dir: Path, tmp_path: Path) -> dict[str, str]:
    """An offline environment whose hub cache holds the tiny model as REPO_ID."""
    cache = tmp_path / "hub"
    place_in_hub_cache(tiny_model_dir, cache, REPO_ID, commit=COMMIT)
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def epd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "epd", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_generate_answers_with_a_model_given_by_hub_id(hub_env: dict[str, str]) -> None:
    result = epd("generate", "--model", REPO_ID, "--max-tokens", "3", env=hub_env)
    assert result.returncode == 0, result.stderr
    assert "answer:" in result.stdout


def test_an_encoder_given_a_hub_id_serves_it_under_that_id(hub_env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "epd", "encode", "--model", REPO_ID, "--port", "0"]
    process = subprocess.Popen(
        [*command, "--transfer", "inline"],
        text=True,
        env=hub_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            match = re.search(r"listening on [^:]+:(\d+)", line)
            assert match, line + (process.stderr.read() if process.poll() is not None else "")
            buffer = io.BytesIO()
            Image.new("RGB", (56, 56), (10, 200, 30)).save(buffer, format="PNG")
            item = multimodal_pb2.MediaItem(data=buffer.getvalue())
            with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
                stub = pb_grpc.EncodeServiceStub(channel)
                request = pb.EncodeRequest(items=[item], model=REPO_ID)
                (response,) = list(stub.Encode(request, timeout=60))
                assert response.embeddings.shape[0] > 0
                with pytest.raises(grpc.RpcError) as wrong:
                    list(stub.Encode(pb.EncodeRequest(items=[item], model=COMMIT), timeout=60))
                assert wrong.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_a_hub_id_missing_from_the_cache_offline_is_a_usage_error(
    hub_env: dict[str, str], tmp_path: Path
) -> None:
    missing = ["--model", "epd-test/absent", "--revision", "v2"]
    for command in (("route",), ("prefill",), ("up", "--run-dir", str(tmp_path)), ("generate",)):
        result = epd(*command, *missing, env=hub_env)
        assert result.returncode == 2, (command, result.stderr[-1000:])
        assert "epd-test/absent (revision v2)" in result.stderr, command
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, command
