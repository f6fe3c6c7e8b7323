"""Where vLLM cannot be imported, what needs it (vLLM prefill and decode workers, KV hand-off
topologies) says so as a usage error instead of failing with a traceback. (That the prefill
worker then falls back to the transformers engine on its own and E/PD answers is shown by
``tests/integration/install/test_wheel.py``, whose fresh venv has no vLLM.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from epd.server.engine.engine_cli import vllm_installed
from tests.epd_main import epd_main


@pytest.fixture
def without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process cannot import vllm (as where it is not installed) until the test ends."""
    monkeypatch.setitem(sys.modules, "vllm", None)


def test_vllm_is_really_hidden(without_vllm: None) -> None:
    assert importlib.util.find_spec("vllm") is None and not vllm_installed()
    with pytest.raises(ImportError):
        import vllm  # noqa: F401


def test_what_needs_vllm_is_a_usage_error(
    tiny_model_dir: Path,
    tmp_path: Path,
    without_vllm: None,
    capsys: pytest.CaptureFixture[str],
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
        result = epd_main(capsys, *args)
        assert result.returncode == 2, (args, result.stderr[-1000:])
        assert message in result.stderr, args


def test_a_malformed_data_plane_setting_is_a_usage_error(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EPD_SHM_MAPPED_BYTES", "1GiB")
    for service in (("prefill", "--engine", "transformers"), ("encode",)):
        result = epd_main(capsys, *service, "--model", str(tiny_model_dir), "--port", "0")
        assert result.returncode == 2, (service, result.stderr[-1000:])
        assert "$EPD_SHM_MAPPED_BYTES must be an integer" in result.stderr, service
