"""The engine tests' transformers oracle; the session's vLLM engines are in
``tests/integration/conftest.py``."""

from __future__ import annotations

import pytest

from epd.server.encode.vision import VisionEncoder
from epd.server.engine.reference import ReferenceEngine


@pytest.fixture(scope="session")
def oracle(tiny_model_dir):
    """The transformers reference engine and the encoder's vision tower."""
    return ReferenceEngine(tiny_model_dir), VisionEncoder(tiny_model_dir)
