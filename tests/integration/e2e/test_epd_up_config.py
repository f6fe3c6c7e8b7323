"""``epd up --config FILE``: one YAML file starts a deployment, and each service it starts reads
the keys it has a flag for and its own section of the same file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.e2e.launcher import assert_demo_answered

QUESTION = "What is in this picture?"


def test_a_config_file_starts_epd_up_and_reaches_its_services(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "epd.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\n"
        "model-id: tiny\n"
        "topology: e-pd\n"
        "engine: transformers\n"
        "max-tokens: 8\n"
        f"question: {QUESTION}\n"
        f"run-dir: {tmp_path / 'run'}\n"
        "encode:\n"
        "  log-level: DEBUG\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPD_")}
    result = subprocess.run(
        [sys.executable, "-m", "epd", "up", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert_demo_answered(result.stdout, tiny_model_dir, QUESTION, max_tokens=8)
    (run_dir,) = (tmp_path / "run").iterdir()
    assert " DEBUG " in (run_dir / "encode0.log").read_text()
    assert " DEBUG " not in (run_dir / "prefill.log").read_text()
