"""The topology matrix for every family beside the default one (whose matrix, and much more, is in
test_pd_vllm.py): P/D with KV over NIXL, E/PD, EPD (raw images into vLLM) and EP/D each answer as
transformers does on the same checkpoint, token for token; and E/PD through a route and an
encoder over real gRPC, on the same engines (test_families_e_pd asks the same chat of the
transformers engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from epd.common.roles import Role
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.encode.vision import VisionEncoder
from epd.server.engine.reference import ReferenceEngine
from epd.server.models.registry import FAMILIES
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.transfer.plane import DataPlane
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from tests.families import skip_unless_run
from tests.integration.e_pd_in_process import e_pd_answer, reference_answer
from tests.pictures import picture

from .helpers import Stubs, embedded_prompt, expected_tokens, media_prompt, release

pytestmark = pytest.mark.vllm
NUM_TOKENS = 12
GREEDY = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
OTHER_FAMILIES = [family.name for family in FAMILIES[1:]]


@pytest.fixture(scope="module", params=OTHER_FAMILIES)
async def served(
    request: pytest.FixtureRequest,
    tiny_family_dir: Callable[[str], Path],
    family_engines: Callable[[str], Awaitable[tuple[Any, Any]]],
) -> AsyncIterator[tuple[Stubs, DataPlane, tuple[ReferenceEngine, VisionEncoder], Path]]:
    skip_unless_run(request, request.param)
    model_dir = tiny_family_dir(request.param)
    engines = await family_engines(request.param)
    stubs = Stubs((engines[0], engines[1]))
    stubs.prefill = await stubs.serve(
        await build_prefill_server(PrefillConfig(model_dir, mode=Role.PREFILL), engines[0]),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.aggregated = await stubs.serve(
        await build_prefill_server(PrefillConfig(model_dir), engines[0]),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.encode_prefill = await stubs.serve(
        await build_prefill_server(
            PrefillConfig(model_dir, mode=Role.ENCODE_PREFILL, hands_off_kv=True), engines[0]
        ),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.decode = await stubs.serve(
        await build_decode_server(DecodeConfig(), engines[1]), decode_grpc.DecodeServiceStub
    )
    plane = DataPlane(stubs.apps[0].worker.plane.host_id)
    yield stubs, plane, (ReferenceEngine(model_dir), VisionEncoder(model_dir)), model_dir
    await stubs.close()
    plane.close()


async def prefill_then_decode(
    stubs: Stubs, request_id: str, prompt: generation_pb2.Prompt
) -> list[int]:
    first = await stubs.prefill.Prefill(
        prefill_pb.PrefillRequest(
            request_id=request_id, model="tiny", prompt=prompt, sampling=GREEDY
        )
    )
    responses = stubs.decode.Decode(
        decode_pb.DecodeRequest(
            request_id=request_id,
            model="tiny",
            prompt_token_ids=prompt.token_ids,
            sampling=GREEDY,
            first_token_id=first.first_token_id,
            kv_handle=first.kv_handle,
        )
    )
    return [first.first_token_id] + [t async for r in responses for t in r.token_ids]


async def aggregated(stub: object, request_id: str, prompt: generation_pb2.Prompt) -> list[int]:
    request = prefill_pb.PrefillDecodeRequest(
        request_id=request_id, model="tiny", prompt=prompt, sampling=GREEDY
    )
    return [t async for r in stub.PrefillDecode(request) for t in r.token_ids]  # type: ignore[attr-defined]


async def test_every_topology_gives_the_reference_tokens(served) -> None:
    stubs, plane, oracle, _ = served
    images, text = [picture(3, 96, 64), picture(4, 60, 90)], "compare these pictures"
    expected = expected_tokens(oracle, images, text, NUM_TOKENS)
    embedded = embedded_prompt(oracle, plane, images, text)
    raw = media_prompt(oracle, images, text)
    try:
        assert await prefill_then_decode(stubs, "pd", embedded) == expected, "P/D"
        assert await aggregated(stubs.aggregated, "e-pd", embedded) == expected, "E/PD"
        assert await aggregated(stubs.encode_prefill, "epd", raw) == expected, "EPD"
        stubs.prefill, saved = stubs.encode_prefill, stubs.prefill
        try:
            assert await prefill_then_decode(stubs, "ep-d", raw) == expected, "EP/D"
        finally:
            stubs.prefill = saved
    finally:
        release(plane, embedded)


async def test_e_pd_through_a_route_equals_transformers(served) -> None:
    stubs, _, _, model_dir = served
    assert await e_pd_answer(model_dir, stubs.producer) == reference_answer(model_dir)
