"""``epd up --embedding-store mooncake``: the Mooncake master starts as one more service, the
encoders join its store, the demo request is answered, and the master stops with the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mooncake import skip_without_mooncake

pytestmark = pytest.mark.integration


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_starts_the_master_answers_and_stops_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    skip_without_mooncake()
    endpoints = tmp_path / "endpoints.json"
    command = [sys.executable, "-m", "epd", "up", "--model", str(tiny_model_dir)]
    command += ["--topology", "e-pd", "--engine", "transformers", "--encoders", "2"]
    command += ["--embedding-store", "mooncake", "--no-metrics", "--max-tokens", "4"]
    command += ["--run-dir", str(tmp_path), "--endpoints-file", str(endpoints)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "store-master" in result.stdout and "assistant:" in result.stdout
    started = json.loads(endpoints.read_text())
    (run_dir,) = tmp_path.glob("2*")
    assert "Master service started" in (run_dir / "store-master.log").read_text()
    assert not is_running(started["pids"]["store-master"])
    for encoder in ("encode0", "encode1"):
        log = (run_dir / f"{encoder}.log").read_text()
        assert "joined the embedding store" in log and "Traceback" not in log, log[-2000:]
