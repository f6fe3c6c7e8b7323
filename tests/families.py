"""Which model families the slow per-family vLLM tests run for.

Each family there starts vLLM engines of its own (about 1-2 min a family on this 2-core
machine), so a plain run takes a slice: the default family, the one whose embeddings carry
DeepStack levels and the one whose rows sit between delimiter tokens with items of its own.
``pytest --all-families`` (tests/conftest.py) runs every family; run it before resolving a
change to the model room or the engines.
"""

from __future__ import annotations

import pytest

CI_FAMILIES = ("qwen2_vl", "qwen3_vl", "internvl")


def skip_unless_run(request: pytest.FixtureRequest, family: str) -> None:
    """Skip, saying why, unless ``family`` is in the slice or ``--all-families`` is given."""
    if family not in CI_FAMILIES and not request.config.getoption("--all-families"):
        pytest.skip(f"{family}: the slice is {', '.join(CI_FAMILIES)}; --all-families runs it")
