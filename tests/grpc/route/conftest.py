"""Fixtures of both doors of one route over a fake engine (``doors.py``): hermes tool calls,
deepseek_r1 reasoning, a plain answer, beam steps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from epd.server.route.tools import ToolOptions
from tests.grpc.route.doors import CALL, DEEPSEEK, HERMES, THOUGHT, BeamEngine, Doors, open_doors


@pytest.fixture(scope="package")
def thinking_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with ``<think>`` and ``</think>`` in its vocabulary."""
    from epd.server.models.tiny.build import build_tiny_model, preset

    config = preset("tiny", added_tokens=("<think>", "</think>"))
    return build_tiny_model(tmp_path_factory.mktemp("thinking") / "tiny-thinking", config)


def doors_fixture(options: ToolOptions | None, answer: str, model: str) -> Any:
    """A fixture of both doors of a route with ``options``' parsers on the fixture ``model``'s
    tiny model, whose engine answers ``answer``."""

    @pytest.fixture
    async def doors(request: pytest.FixtureRequest) -> AsyncIterator[Doors]:
        model_dir = request.getfixturevalue(model)
        opened, http, server = await open_doors(model_dir, options, answer)
        yield opened
        await http.stop()
        await server.drain_and_stop(0)

    return doors


hermes = doors_fixture(HERMES, CALL, "tiny_model_dir")
deepseek = doors_fixture(DEEPSEEK, THOUGHT, "thinking_model_dir")
plain = doors_fixture(None, CALL, "tiny_model_dir")


@pytest.fixture
async def beams(tiny_model_dir: Path) -> AsyncIterator[Doors]:
    """Both doors of a route whose engine answers beam steps (``BeamEngine``): its candidates
    two word pieces, the end of sequence, then others."""
    opened, http, server = await open_doors(tiny_model_dir, None, "sunny cloudy rain snow")
    first, second, *others = opened.engine.tokens[:-1]
    opened.engine.__class__ = BeamEngine  # NOTE: the router's engine object, its calls kept
    opened.engine.tokens = [first, second, opened.tokenizer.eos_token_id, *others]
    yield opened
    await http.stop()
    await server.drain_and_stop(0)
