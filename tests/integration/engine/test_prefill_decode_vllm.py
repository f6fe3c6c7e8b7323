"""E/PD on vLLM: encoder embeddings through the data plane into a prefill_decode worker give the
reference tokens; concurrency, cancellation and bad inputs over gRPC."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from PIL import Image

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.common.status import from_rpc_error
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2, multimodal_pb2
from epd.v1 import prefill_service_pb2 as pb
from epd.v1 import prefill_service_pb2_grpc as pb_grpc
from tests.pictures import picture, png

from .helpers import chat

pytestmark = pytest.mark.vllm
NUM_TOKENS = 16


@pytest.fixture(scope="module")
async def stack(tiny_model_dir, engines):
    app = await build_prefill_server(PrefillConfig(tiny_model_dir), engines[0])
    channel = create_channel(f"127.0.0.1:{app.port}")
    producer = DataPlane(app.worker.plane.host_id)
    yield pb_grpc.PrefillServiceStub(channel), producer, app
    await channel.close()
    await app.stop()
    producer.close()


def build_request(
    oracle,
    producer: DataPlane,
    images: list[Image.Image],
    text: str,
    request_id: str,
    **sampling,
) -> tuple[pb.PrefillDecodeRequest, list[int]]:
    reference, encoder = oracle
    messages = chat(len(images), text)
    token_ids = reference.processor.tokenizer(reference.render(messages))["input_ids"]
    inputs = []
    for i, (embeddings, grid) in enumerate(encoder.encode([image])[0] for image in images):
        ref = producer.put(embeddings, producer.host_id)
        inputs.append(
            multimodal_pb2.ImageInput(
                mm_hash=f"h{i}",
                grid=multimodal_pb2.ImageGrid(t=grid[0], h=grid[1], w=grid[2]),
                embeddings=ref,
            )
        )
    params = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True, **sampling)
    request = pb.PrefillDecodeRequest(
        request_id=request_id,
        model="tiny",
        sampling=params,
        prompt=generation_pb2.Prompt(token_ids=token_ids, images=inputs),
    )
    expected = reference.generate(messages, images, max_tokens=NUM_TOKENS, ignore_eos=True)
    return request, expected.token_ids


async def collect(stub, request) -> tuple[list[int], list[pb.PrefillDecodeResponse]]:
    responses = [r async for r in stub.PrefillDecode(request)]
    return [t for r in responses for t in r.token_ids], responses


async def test_epd_tokens_equal_the_transformers_reference(stack, oracle) -> None:
    stub, producer, _ = stack
    images = [picture(1, 96, 64), picture(2, 60, 90)]
    request, expected = build_request(oracle, producer, images, "describe this picture", "r1")
    tokens, responses = await collect(stub, request)
    assert tokens == expected
    last = responses[-1]
    assert last.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert last.usage.completion_tokens == NUM_TOKENS and last.usage.prompt_tokens > 20
    producer.release([i.embeddings.lease_id for i in request.prompt.images])


async def test_concurrent_requests_each_get_their_own_answer(stack, oracle) -> None:
    stub, producer, _ = stack
    cases = [
        build_request(
            oracle, producer, [picture(10 + i, 56 + 8 * i, 56)], f"what is shown {i}?", f"c{i}"
        )
        for i in range(3)
    ]
    results = await asyncio.gather(*(collect(stub, request) for request, _ in cases))
    for (request, expected), (tokens, _) in zip(cases, results, strict=True):
        assert tokens == expected
        producer.release([i.embeddings.lease_id for i in request.prompt.images])


async def test_text_only_prompt_and_stop_token(stack, oracle) -> None:
    stub, producer, _ = stack
    request, expected = build_request(oracle, producer, [], "hello world", "t1")
    tokens, _ = await collect(stub, request)
    assert tokens == expected
    request.request_id = "t2"
    request.sampling.stop_token_ids.append(expected[2])
    tokens, responses = await collect(stub, request)
    assert tokens == expected[:3]
    assert responses[-1].finish_reason == generation_pb2.FINISH_REASON_STOP


async def test_cancellation_aborts_the_engine_request(stack, oracle) -> None:
    stub, producer, app = stack
    request, _ = build_request(oracle, producer, [picture(3, 56, 56)], "describe", "x1")
    request.sampling.max_tokens = 2000
    call = stub.PrefillDecode(request)
    await call.read()
    call.cancel()
    for _ in range(100):
        if app.worker.engine.load().num_running == 0:
            break
        await asyncio.sleep(0.05)
    assert app.worker.engine.load().num_running == 0
    producer.release([i.embeddings.lease_id for i in request.prompt.images])


async def expect_error(stub, request, code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await collect(stub, request)
    assert caught.value.code() == code, caught.value.details()
    assert from_rpc_error(caught.value).reason == reason


async def test_bad_inputs_get_clear_status_codes(stack, oracle) -> None:
    stub, producer, _ = stack
    request, _ = build_request(oracle, producer, [picture(4, 56, 56)], "describe", "b1")
    invalid = grpc.StatusCode.INVALID_ARGUMENT

    wrong_model = pb.PrefillDecodeRequest()
    wrong_model.CopyFrom(request)
    wrong_model.model = "llama"
    await expect_error(stub, wrong_model, invalid, "WRONG_MODEL")

    bad_grid = pb.PrefillDecodeRequest()
    bad_grid.CopyFrom(request)
    bad_grid.prompt.images[0].grid.h += 2
    await expect_error(stub, bad_grid, invalid, "EMBEDDING_SHAPE_MISMATCH")

    missing = pb.PrefillDecodeRequest()
    missing.CopyFrom(request)
    missing.prompt.images[0].ClearField("embeddings")
    await expect_error(stub, missing, invalid, "MISSING_IMAGE_DATA")

    extra = pb.PrefillDecodeRequest()
    extra.CopyFrom(request)
    extra.prompt.images.append(request.prompt.images[0])
    await expect_error(stub, extra, invalid, "IMAGE_COUNT_MISMATCH")

    producer.release([i.embeddings.lease_id for i in request.prompt.images])
    await expect_error(stub, request, grpc.StatusCode.NOT_FOUND, "LEASE_RELEASED")

    await expect_error(
        stub, pb.PrefillDecodeRequest(request_id="e", model="tiny"), invalid, "EMPTY_PROMPT"
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Prefill(pb.PrefillRequest(request_id="p"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_raw_images_need_an_encode_prefill_worker(stack, oracle) -> None:
    stub, producer, _ = stack
    request, _ = build_request(oracle, producer, [picture(5, 56, 56)], "describe", "raw")
    producer.release([i.embeddings.lease_id for i in request.prompt.images])
    request.prompt.images[0].media.CopyFrom(multimodal_pb2.MediaItem(data=b"png bytes"))
    await expect_error(stub, request, grpc.StatusCode.FAILED_PRECONDITION, "RAW_IMAGES_UNSUPPORTED")


async def test_encode_prefill_mode_takes_raw_images(stack, oracle, tiny_model_dir) -> None:
    _, producer, app = stack
    raw_app = await build_prefill_server(
        PrefillConfig(tiny_model_dir, mode=Role.ENCODE_PREFILL), app.worker.engine
    )
    images = [picture(6, 96, 64), picture(7, 60, 90)]
    request, expected = build_request(oracle, producer, images, "describe this picture", "ep1")
    producer.release([i.embeddings.lease_id for i in request.prompt.images])
    for image_input, image in zip(request.prompt.images, images, strict=True):
        image_input.media.CopyFrom(multimodal_pb2.MediaItem(data=png(image)))
    async with create_channel(f"127.0.0.1:{raw_app.port}") as channel:
        tokens, _ = await collect(pb_grpc.PrefillServiceStub(channel), request)
    await raw_app.stop()
    assert tokens == expected
