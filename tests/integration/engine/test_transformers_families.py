"""The transformers engine for every family beside the default one (whose tests are in
test_transformers_engine.py): E/PD (the encoder's embeddings) and EPD (raw images, encoded by the
engine's own model) answer as transformers' generate does on the same checkpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.server.encode.vision import VisionEncoder
from epd.server.engine.reference import ReferenceEngine
from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.models.registry import FAMILIES
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as pb
from epd.v1 import prefill_service_pb2_grpc as pb_grpc
from tests.pictures import picture

from .helpers import embedded_prompt, expected_tokens, media_prompt, release

NUM_TOKENS = 12
GREEDY = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
OTHER_FAMILIES = [family.name for family in FAMILIES[1:]]


@pytest.fixture(scope="module", params=OTHER_FAMILIES)
async def served(
    request: pytest.FixtureRequest, tiny_family_dir: Callable[[str], Path]
) -> AsyncIterator[tuple[dict[Role, Any], DataPlane, tuple[ReferenceEngine, VisionEncoder]]]:
    model_dir = tiny_family_dir(request.param)
    engine = await TransformersEngine.start(model_dir, model_id="tiny")
    modes = (Role.PREFILL_DECODE, Role.ENCODE_PREFILL)
    apps = [await build_prefill_server(PrefillConfig(model_dir, mode=m), engine) for m in modes]
    channels = [create_channel(f"127.0.0.1:{app.port}") for app in apps]
    stubs = {m: pb_grpc.PrefillServiceStub(c) for m, c in zip(modes, channels, strict=True)}
    plane = DataPlane(apps[0].worker.plane.host_id)
    yield stubs, plane, (ReferenceEngine(model_dir), VisionEncoder(model_dir))
    for channel, app in zip(channels, apps, strict=True):
        await channel.close()
        await app.stop()
    plane.close()
    await engine.close()


async def generate(stub: Any, request_id: str, prompt: generation_pb2.Prompt) -> list[int]:
    request = pb.PrefillDecodeRequest(
        request_id=request_id, model="tiny", prompt=prompt, sampling=GREEDY
    )
    return [t async for r in stub.PrefillDecode(request) for t in r.token_ids]


async def test_e_pd_and_epd_give_the_reference_tokens(served) -> None:
    stubs, plane, oracle = served
    images, text = [picture(5, 96, 64), picture(6, 60, 90)], "compare these pictures"
    expected = expected_tokens(oracle, images, text, NUM_TOKENS)
    embedded = embedded_prompt(oracle, plane, images, text)
    try:
        assert await generate(stubs[Role.PREFILL_DECODE], "e-pd", embedded) == expected, "E/PD"
    finally:
        release(plane, embedded)
    raw = media_prompt(oracle, images, text)
    assert await generate(stubs[Role.ENCODE_PREFILL], "epd", raw) == expected, "EPD"
