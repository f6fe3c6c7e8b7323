"""``epd up`` (the README's first command) for each model family: the answer equals the reference
tokens. The default topology itself (E/P/D on vLLM) is checked by ``stack_e2e`` (answers,
one trace across every service, nothing left running or in /dev/shm, no traceback or
resource_tracker warning in a log), ``epd up``'s one-shot run (the demo answered, then every
process stopped) by ``tests/integration/install/test_wheel.py`` on the installed wheel, and the
vLLM workers' clean stop by ``tests/integration/engine/test_prefill_process.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epd.server.models.registry import FAMILIES
from tests.integration.e2e.launcher import assert_demo_answered, epd_command

pytestmark = pytest.mark.vllm
# NOTE: none in CI (86 s each): every family's E/PD answer is checked on both engines over real
# gRPC (test_families_e_pd, test_families_matrix), and the launcher names no family;
# --all-families runs them all (the first family is stack_e2e's).
CI_FAMILIES: tuple[str, ...] = ()
QUESTION = "What is in this picture?"


@pytest.mark.parametrize("family", [family.name for family in FAMILIES[1:]])
def test_epd_up_serves_each_family_with_the_reference_tokens(
    family: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``epd model tiny --family F`` then ``epd up --model DIR``: the answer equals
    transformers' generate on the same checkpoint (and so monolithic vLLM's: test_tiny_model)."""
    if family not in CI_FAMILIES and not request.config.getoption("--all-families"):
        pytest.skip(f"{family}: E/PD is checked in CI in-process; --all-families runs this too")
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
