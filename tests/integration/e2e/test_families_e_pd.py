"""Every supported family in E/PD on the transformers engine, in one process over real gRPC: text
around two images of different sizes, answered token for token as transformers' generate answers
on the same checkpoint. The same chat on vLLM engines is asked by
``tests/integration/engine/test_families_matrix.py`` for every family beside the default one (on
the engines its matrix starts anyway), and the default family's E/PD on vLLM by
``route_epd_in_process/test_grpc_door.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.models.registry import FAMILIES
from tests.families import skip_unless_run
from tests.integration.e_pd_in_process import e_pd_answer, reference_answer


@pytest.fixture(params=[family.name for family in FAMILIES])
async def family_dir(
    request: pytest.FixtureRequest, tiny_family_dir: Callable[[str], Path]
) -> AsyncIterator[Path]:
    skip_unless_run(request, request.param)
    yield tiny_family_dir(request.param)


async def test_e_pd_equals_transformers_for_every_family(family_dir: Path) -> None:
    engine = await TransformersEngine.start(family_dir, model_id="m")
    try:
        tokens = await e_pd_answer(family_dir, engine)
    finally:
        await engine.close()
    assert tokens == reference_answer(family_dir)
