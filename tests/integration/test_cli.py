"""The ``epd`` console script as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.epd_main import epd_main

EPD = [sys.executable, "-m", "epd"]


def run_epd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EPD, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_help_lists_commands() -> None:
    result = run_epd("--help")
    assert result.returncode == 0
    assert "model" in result.stdout and "generate" in result.stdout


def test_unknown_command_is_a_usage_error() -> None:
    result = run_epd("frobnicate")
    assert result.returncode == 2
    assert "unknown command 'frobnicate'" in result.stderr


def test_model_tiny_reports_progress_and_rejects_bad_sizes(tmp_path: Path) -> None:
    built = run_epd("model", "tiny", "--out", str(tmp_path / "m"))
    assert built.returncode == 0, built.stderr
    assert "training tokenizer" in built.stderr and "saved" in built.stderr
    assert (tmp_path / "m" / "model.safetensors").is_file()
    bad = run_epd("model", "tiny", "--out", str(tmp_path / "x"), "--hidden-size", "100")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_generate_answers_about_an_image(tiny_model_dir: Path, tmp_path: Path) -> None:
    image = tmp_path / "red.png"
    Image.new("RGB", (40, 30), (200, 10, 10)).save(image)
    result = run_epd(
        "generate",
        "--model",
        str(tiny_model_dir),
        "--image",
        str(image),
        "--max-tokens",
        "5",
        "What color is it?",
    )
    assert result.returncode == 0, result.stderr
    assert "answer:" in result.stdout and "1 image(s)" in result.stdout


def test_generate_rejects_unreadable_image_without_traceback(tmp_path: Path) -> None:
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    result = run_epd("generate", "--model", str(tmp_path), "--image", str(broken))
    assert result.returncode == 2
    assert "cannot read image" in result.stderr and "Traceback" not in result.stderr


def test_bad_thread_counts_are_usage_errors(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    encode = epd_main(capsys, "encode", "--model", str(tiny_model_dir), "--threads", "-1")
    assert encode.returncode == 2 and "--threads" in encode.stderr
    up = epd_main(
        capsys,
        "up",
        "--model",
        str(tiny_model_dir),
        "--topology",
        "dual-encoder",
        "--encoder-threads",
        "2,x",
        "--run-dir",
        str(tmp_path),
    )
    assert up.returncode == 2 and "--encoder-threads" in up.stderr


def test_bad_engine_flags_and_model_dirs_are_usage_errors(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("prefill", "decode", "route"):
        empty = epd_main(capsys, command, "--model", str(tmp_path))
        assert empty.returncode == 2, (command, empty.stderr)
        assert f"epd {command}: {tmp_path} is not a model directory" in empty.stderr
    model = ["--model", str(tiny_model_dir)]
    lease = epd_main(capsys, "prefill", *model, "--mode", "prefill", "--kv-lease-s", "3")
    assert lease.returncode == 2 and "--kv-lease-s must be at least 6" in lease.stderr
    pending = epd_main(capsys, "decode", *model, "--max-pending", "0")
    assert pending.returncode == 2 and "--max-pending must be at least 1" in pending.stderr


def test_an_unsupported_architecture_is_refused_at_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One service as a user starts it (nothing else on stderr), the others in this process."""
    (tmp_path / "config.json").write_text('{"architectures": ["Gemma3ForConditionalGeneration"]}')
    refusals = {"encode": run_epd("encode", "--model", str(tmp_path))}
    for command in ("prefill", "decode", "route"):
        refusals[command] = epd_main(capsys, command, "--model", str(tmp_path))
    for command, refused in refusals.items():
        assert refused.returncode == 2, (command, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, (command, refused.stderr)
        assert "Gemma3ForConditionalGeneration is not supported" in lines[0]
        assert "Qwen2-VL (qwen2_vl), Qwen2.5-VL (qwen2_5_vl)" in lines[0]
