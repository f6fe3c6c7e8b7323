"""``epd up`` where vLLM cannot be imported: the prefill worker falls back to the transformers
engine on its own (``--engine auto``), E/PD answers with the reference tokens, and what needs
vLLM (decode workers, KV hand-off topologies) says so instead of failing with a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epd.client import EpdClient, user
from epd.common.channels import wait_for_health
from epd.server.transfer import shm
from tests.integration.e2e.launcher import (
    assert_demo_answered,
    is_alive,
    running_stack,
    segments_of,
)
from tests.pictures import picture, png

QUESTION = "What is in this picture?"


@pytest.fixture
def without_vllm(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes cannot import vllm (as where it is not installed)."""
    hider = tmp_path / "hide_vllm"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text("import sys\nsys.modules['vllm'] = None\n")
    path = os.pathsep.join(p for p in (str(hider), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def epd(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epd", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_vllm_is_really_hidden(without_vllm: dict[str, str], tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import vllm"], env=without_vllm, capture_output=True, text=True
    )
    assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr


def test_e_pd_answers_on_the_transformers_engine(
    tiny_model_dir: Path, tmp_path: Path, without_vllm: dict[str, str]
) -> None:
    before = set(shm.orphans())
    result = epd(
        "up",
        "--model",
        str(tiny_model_dir),
        "--model-id",
        "tiny",
        "--topology",
        "e-pd",
        "--max-tokens",
        "8",
        "--question",
        QUESTION,
        "--run-dir",
        str(tmp_path / "run"),
        env=without_vllm,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert_demo_answered(result.stdout, tiny_model_dir, QUESTION, max_tokens=8)
    prefill_log = next((tmp_path / "run").glob("*/prefill.log")).read_text()
    assert "(prefill_decode, transformers)" in prefill_log
    assert "epd-encode" in result.stdout and "epd-prefill" in result.stdout
    leftovers = subprocess.run(
        ["pgrep", "-f", "-m epd (scheduler|encode|prefill|route) "], capture_output=True, text=True
    )
    assert leftovers.stdout.strip() == ""
    assert set(shm.orphans()) <= before


def test_what_needs_vllm_is_a_usage_error(
    tiny_model_dir: Path, tmp_path: Path, without_vllm: dict[str, str]
) -> None:
    model = ["--model", str(tiny_model_dir)]
    cases = {
        ("prefill", *model, "--engine", "vllm"): "vLLM is not installed",
        ("prefill", *model, "--mode", "prefill"): "does not hand its KV cache",
        (
            "prefill",
            *model,
            "--engine",
            "transformers",
            "--mode",
            "encode_prefill",
            "--kv-transfer",
        ): "does not hand its KV cache",
        ("decode", *model): "vLLM is not installed",
        (
            "up",
            *model,
            "--engine",
            "transformers",
            "--topology",
            "ep-d",
            "--run-dir",
            str(tmp_path),
        ): "does not hand KV",
    }
    for args, message in cases.items():
        result = epd(*args, env=without_vllm, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr[-1000:])
        assert message in result.stderr and "Traceback" not in result.stderr, args


def test_a_malformed_data_plane_setting_is_a_usage_error(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "EPD_SHM_MAPPED_BYTES": "1GiB"}
    for service in (("prefill", "--engine", "transformers"), ("encode",)):
        result = epd(*service, "--model", str(tiny_model_dir), "--port", "0", env=env, cwd=tmp_path)
        assert result.returncode == 2, (service, result.stderr[-1000:])
        assert "$EPD_SHM_MAPPED_BYTES must be an integer" in result.stderr, service
        assert "Traceback" not in result.stderr, service


def test_a_killed_encoder_is_reported_restarted_and_leaves_no_shared_memory(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    question = [user(QUESTION, image=png(picture(1, 64, 64)))]
    topology = ("--topology", "e-pd", "--engine", "transformers")
    with running_stack(tiny_model_dir, tmp_path, *topology) as stack:
        with EpdClient(stack.route, timeout_s=120) as client:
            expected = client.generate(question, max_tokens=2, ignore_eos=True).token_ids
        killed = stack.pids["encode0"]
        assert segments_of([killed]), "the encoder put no tensor into shared memory"
        os.kill(killed, signal.SIGKILL)
        line = f"epd up: encode0 (pid {killed}) was killed by SIGKILL; log {stack.run_dir}"
        log = tmp_path / "launcher.log"
        deadline = time.monotonic() + 30
        while line not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert line in log.read_text() and "restarting it (1 of 3)" in log.read_text()
        assert segments_of([killed]) == []  # removed as soon as the launcher noticed
        endpoints = json.loads((tmp_path / "endpoints.json").read_text())
        restarted = endpoints["pids"]["encode0"]
        assert restarted != killed and is_alive(restarted)
        asyncio.run(wait_for_health(endpoints["encode0"], timeout_s=60))
        with EpdClient(stack.route, timeout_s=120) as client:
            assert client.generate(question, max_tokens=2, ignore_eos=True).token_ids == expected
    assert stack.launcher.returncode == 130
    assert segments_of([*stack.pids.values(), restarted]) == []
