"""The deployment's gRPC door: the answer to a chat with two images equals the transformers
reference token for token; the models it lists; a bad image refused, holding nothing; each
image decoded and hashed once in the deployment."""

from __future__ import annotations

import grpc
import pytest

from epd.common.status import from_rpc_error
from epd.server.engine.reference import ReferenceEngine
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2
from tests.integration.e2e.route_epd_deployment import (
    chat_request,
    count_decodes_and_hashes,
    counted,
)
from tests.pictures import picture

pytestmark = pytest.mark.vllm


async def test_two_images_answer_equals_the_reference(deployment, tiny_model_dir) -> None:
    stub, encoders, _, _ = deployment
    images = [picture(1, 96, 64), picture(2, 60, 90)]
    request = chat_request(images, "describe this picture", max_tokens=12, ignore_eos=True)
    responses = [r async for r in stub.Generate(request)]
    tokens = [t for r in responses for t in r.token_ids]
    reference = ReferenceEngine(tiny_model_dir)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "image"},
                {"type": "text", "text": "describe this picture"},
            ],
        }
    ]
    expected = reference.generate(messages, images, max_tokens=12, ignore_eos=True)
    assert tokens == expected.token_ids
    assert "".join(r.text for r in responses) == expected.text
    assert responses[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert responses[-1].usage.completion_tokens == 12
    assert all(encoder.worker.plane.held() == [] for encoder in encoders)
    assert_pixels_shared_and_released(deployment)


def assert_pixels_shared_and_released(deployment) -> None:
    """The encoders read the route's pixels (they decoded nothing), which it no longer holds."""
    _, encoders, route, _ = deployment
    assert all(len(encoder.worker.loader.cache) == 0 for encoder in encoders)
    assert route.router.plane.held() == []


async def test_list_models_shows_the_deployment(deployment) -> None:
    stub, _, _, _ = deployment
    reply = await stub.ListModels(route_service_pb2.ListModelsRequest())
    (card,) = reply.models
    assert card.id == "tiny" and dict(card.worker_counts) == {"encode": 2, "prefill_decode": 1}


async def test_bad_image_is_a_clear_error_and_holds_nothing(deployment) -> None:
    stub, encoders, route, _ = deployment
    request = chat_request([], "hi")
    request.messages[0].content.insert(
        0, route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=b"not an image"))
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [r async for r in stub.Generate(request)]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == "BAD_IMAGE"
    assert all(encoder.worker.plane.held() == [] for encoder in encoders)
    assert route.router.plane.held() == []


async def test_each_image_is_decoded_and_hashed_once_in_the_deployment(
    deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route decodes and hashes a picture; its encoder takes the pixels the route shared,
    tagged with their mm_hash, and neither decodes nor hashes them again; the prefill worker
    takes the embeddings the encoder tagged with it and names them by it, unhashed."""
    from epd.server.engine import vllm_embeds

    counts = count_decodes_and_hashes(monkeypatch)
    monkeypatch.setattr(
        vllm_embeds,
        "embeddings_hash",
        counted(counts, "embeddings hash", vllm_embeds.embeddings_hash),
    )
    stub, encoders, _, _ = deployment
    request = chat_request([picture(31, 300, 260)], "describe", max_tokens=2, ignore_eos=True)
    responses = [r async for r in stub.Generate(request)]
    assert sum(len(r.token_ids) for r in responses) == 2
    assert counts == {"decode": 1, "hash": 1}  # NOTE: and no "embeddings hash"
    assert sum(encoder.worker.loader.num_decoded for encoder in encoders) == 0
