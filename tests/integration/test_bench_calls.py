"""scripts/bench_calls.py runs: both modes answer, figures are positive, --json is one object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_calls.py"


def test_bench_calls_prints_figures_for_both_modes() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--calls", "40", "--json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert set(figures) == {"per call", "session"}
    for row in figures.values():
        assert 0 < row["first_p50_ms"] <= row["whole_p50_ms"]
        assert row["calls_per_s"] > 0


def test_bench_calls_refuses_too_few_calls() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--calls", "3"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--calls must be at least 20" in done.stderr
