"""``epd up`` (the README's first command) across real processes: the answer equals the
reference tokens, the trace spans every service, nothing is left running or in /dev/shm, and the
vLLM workers stop without a traceback or a resource_tracker warning in their logs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epd.server.models.registry import FAMILIES
from epd.server.transfer import shm
from tests.integration.e2e.launcher import assert_demo_answered, epd_command

pytestmark = pytest.mark.vllm
# NOTE: every family's `epd up` takes 1-2 min here; CI runs the family least like Qwen2-VL
# (placeholder delimiters, tiles, a hand-rendered vLLM input), `--all-families` runs them all.
# NOTE: none in CI (86 s each): every family's E/PD answer is checked on both engines over real
# gRPC by test_families_e_pd, and the launcher names no family; --all-families runs them all.
CI_FAMILIES: tuple[str, ...] = ()
QUESTION = "What is in this picture?"


def test_epd_up_answers_through_every_service(tiny_model_dir: Path, tmp_path: Path) -> None:
    before = set(shm.orphans())
    result = subprocess.run(
        epd_command(
            "up", tiny_model_dir, "--max-tokens", "8", "--question", QUESTION, "--encoders", "2"
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert_demo_answered(result.stdout, tiny_model_dir, QUESTION, max_tokens=8)
    for service in ("epd-route", "epd-scheduler", "epd-encode", "epd-prefill"):
        assert service in result.stdout
    leftovers = subprocess.run(
        ["pgrep", "-f", "-m epd (scheduler|encode|prefill|route) "], capture_output=True, text=True
    )
    assert leftovers.stdout.strip() == ""
    assert set(shm.orphans()) <= before, "processes of epd up left shared memory behind"
    for worker in ("prefill", "decode"):
        log = next(tmp_path.glob(f".epd/run/*/{worker}.log")).read_text()
        for noise in ("Traceback", "TypeError", "leaked semaphore", "leaked shared_memory"):
            assert noise not in log, f"{worker}.log: {noise}\n{log[-3000:]}"


@pytest.mark.parametrize("family", [family.name for family in FAMILIES[1:]])
def test_epd_up_serves_each_family_with_the_reference_tokens(
    family: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``epd model tiny --family F`` then ``epd up --model DIR``: the answer equals
    transformers' generate on the same checkpoint (and so monolithic vLLM's: test_tiny_model)."""
    if family not in CI_FAMILIES and not request.config.getoption("--all-families"):
        pytest.skip(f"{family}: test_families_e_pd checks it in CI; --all-families runs this too")
    model_dir = tmp_path / "model"
    built = subprocess.run(
        [sys.executable, "-m", "epd", "model", "tiny", "--family", family, "--out", str(model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    result = subprocess.run(
        epd_command("up", model_dir, "--max-tokens", "8", "--question", QUESTION),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert_demo_answered(result.stdout, model_dir, QUESTION, max_tokens=8)
