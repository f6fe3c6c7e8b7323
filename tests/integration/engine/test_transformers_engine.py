"""The transformers fallback engine served by prefill workers (no vLLM): E/PD and EPD give the
reference tokens; concurrency, sampling, stop rules, cancellation, admission and bad inputs."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import numpy as np
import pytest
import torch

from epd.common.channels import create_channel
from epd.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from epd.common.roles import Role
from epd.common.status import from_rpc_error
from epd.server.engine.base import EngineImage, Sampling
from epd.server.engine.transformers_engine import TransformersEngine, TransformersOptions
from epd.server.media.grid import ImageGridder
from epd.server.media.image_settings import ImageSettings
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2, multimodal_pb2
from epd.v1 import prefill_service_pb2 as pb
from epd.v1 import prefill_service_pb2_grpc as pb_grpc
from tests.pictures import picture

from .helpers import (
    chat,
    embedded_prompt,
    expected_tokens,
    media_prompt,
    prompt_tokens,
    release,
)

NUM_TOKENS = 16
GREEDY = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)


class Stack:
    """An engine, a prefill_decode and an encode_prefill server on it, a producer plane."""

    engine: TransformersEngine
    aggregated: pb_grpc.PrefillServiceStub
    encode_prefill: pb_grpc.PrefillServiceStub
    plane: DataPlane


@pytest.fixture(scope="module")
async def stack(tiny_model_dir):
    stack = Stack()
    stack.engine = await TransformersEngine.start(tiny_model_dir, model_id="tiny")
    apps = [
        await build_prefill_server(PrefillConfig(tiny_model_dir, mode=mode), stack.engine)
        for mode in (Role.PREFILL_DECODE, Role.ENCODE_PREFILL)
    ]
    channels = [create_channel(f"127.0.0.1:{app.port}") for app in apps]
    stack.aggregated, stack.encode_prefill = (pb_grpc.PrefillServiceStub(c) for c in channels)
    stack.plane = DataPlane(apps[0].worker.plane.host_id)
    yield stack
    for channel, app in zip(channels, apps, strict=True):
        await channel.close()
        await app.stop()
    stack.plane.close()
    await stack.engine.close()


async def generate(
    stub,
    request_id: str,
    prompt: generation_pb2.Prompt,
    sampling: generation_pb2.SamplingParams = GREEDY,
) -> tuple[list[int], pb.PrefillDecodeResponse]:
    request = pb.PrefillDecodeRequest(
        request_id=request_id, model="tiny", prompt=prompt, sampling=sampling
    )
    responses = [r async for r in stub.PrefillDecode(request)]
    return [t for r in responses for t in r.token_ids], responses[-1]


async def test_e_pd_with_two_images_gives_the_reference_tokens(stack, oracle) -> None:
    images, text = [picture(1, 96, 64), picture(2, 60, 90)], "describe this picture"
    prompt = embedded_prompt(oracle, stack.plane, images, text)
    tokens, last = await generate(stack.aggregated, "r1", prompt)
    assert tokens == expected_tokens(oracle, images, text, NUM_TOKENS)
    assert last.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert last.usage.completion_tokens == NUM_TOKENS
    assert last.usage.prompt_tokens == len(prompt.token_ids) - 2 + sum(
        g.t * g.h * g.w // 4 for g in (i.grid for i in prompt.images)
    )
    release(stack.plane, prompt)
    assert stack.engine.budget.num_used == 0


async def test_epd_from_raw_images_gives_the_reference_tokens(stack, oracle) -> None:
    images, text = [picture(3, 96, 64), picture(4, 60, 90)], "describe this picture"
    tokens, _ = await generate(stack.encode_prefill, "raw", media_prompt(oracle, images, text))
    assert tokens == expected_tokens(oracle, images, text, NUM_TOKENS)


async def test_a_raw_image_under_a_pixel_budget_is_the_encoders_under_it(
    stack, oracle, tiny_model_dir
) -> None:
    """EPD's raw picture under its item's pixel budget (``MediaItem.image_settings``) is resized
    as an encoder resizes it under that budget: the same grid, the same tokens (E/PD on the same
    engine), and fewer prompt tokens than without the budget."""
    _, encoder = oracle
    image, text, small = picture(30, 150, 100), "describe this picture", ImageSettings(3136, 5000)
    raw = media_prompt(oracle, [image], text)
    raw.images[0].media.image_settings = small.key
    tokens, last = await generate(stack.encode_prefill, "budget-raw", raw)
    pixels = torch.from_numpy(np.array(image))
    ((embeddings, grid),) = encoder.run([encoder.prepare(pixels, small)])
    assert grid == ImageGridder(tiny_model_dir).grid_of_size(150, 100, small)
    image_input = multimodal_pb2.ImageInput(
        mm_hash="budget-embedded",
        grid=multimodal_pb2.ImageGrid(t=grid[0], h=grid[1], w=grid[2]),
        embeddings=stack.plane.put(embeddings, stack.plane.host_id),
    )
    embedded = generation_pb2.Prompt(token_ids=prompt_tokens(oracle, 1, text), images=[image_input])
    assert (await generate(stack.aggregated, "budget-embedded", embedded))[0] == tokens
    release(stack.plane, embedded)
    _, plain = await generate(
        stack.encode_prefill, "plain-raw", media_prompt(oracle, [image], text)
    )
    assert last.usage.prompt_tokens < plain.usage.prompt_tokens


async def test_concurrent_requests_each_get_their_own_answer(stack, oracle) -> None:
    cases = [([picture(10 + i, 56 + 8 * i, 56)], f"what is shown {i}?") for i in range(3)]
    prompts = [embedded_prompt(oracle, stack.plane, images, text) for images, text in cases]
    results = await asyncio.gather(
        *(generate(stack.aggregated, f"c{i}", prompt) for i, prompt in enumerate(prompts))
    )
    for (images, text), (tokens, _), prompt in zip(cases, results, prompts, strict=True):
        assert tokens == expected_tokens(oracle, images, text, NUM_TOKENS)
        release(stack.plane, prompt)


async def test_end_of_sequence_stop_token_and_stop_string(stack, oracle) -> None:
    reference, _ = oracle
    prompt = generation_pb2.Prompt(token_ids=prompt_tokens(oracle, 0, "hello world"))
    natural = reference.generate(chat(0, "hello world"), [], max_tokens=64)
    tokens, last = await generate(
        stack.aggregated, "eos", prompt, generation_pb2.SamplingParams(max_tokens=64)
    )
    assert tokens == natural.token_ids
    assert (
        last.finish_reason
        == {
            "stop": generation_pb2.FINISH_REASON_STOP,
            "length": generation_pb2.FINISH_REASON_LENGTH,
        }[natural.finish_reason]
    )

    full, _ = await generate(stack.aggregated, "all", prompt)
    by_id = generation_pb2.SamplingParams(
        max_tokens=NUM_TOKENS, ignore_eos=True, stop_token_ids=[full[4]]
    )
    tokens, last = await generate(stack.aggregated, "id", prompt, by_id)
    assert tokens == full[: full.index(full[4]) + 1]
    assert last.finish_reason == generation_pb2.FINISH_REASON_STOP

    text = reference.processor.tokenizer.decode(full, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    by_text = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True, stop=[stop])
    tokens, last = await generate(stack.aggregated, "text", prompt, by_text)
    decoded = reference.processor.tokenizer.decode(tokens, skip_special_tokens=True)
    assert tokens == full[: len(tokens)] and len(tokens) < NUM_TOKENS
    assert stop in decoded and stop not in reference.processor.tokenizer.decode(
        tokens[:-1], skip_special_tokens=True
    )
    assert last.finish_reason == generation_pb2.FINISH_REASON_STOP


async def test_seeded_sampling_is_repeatable(stack, oracle) -> None:
    prompt = generation_pb2.Prompt(token_ids=prompt_tokens(oracle, 0, "tell a story"))

    def sampling(seed: int) -> generation_pb2.SamplingParams:
        return generation_pb2.SamplingParams(
            max_tokens=NUM_TOKENS, ignore_eos=True, temperature=5.0, top_k=50, seed=seed
        )

    first, _ = await generate(stack.aggregated, "s1", prompt, sampling(1234))
    again, _ = await generate(stack.aggregated, "s2", prompt, sampling(1234))
    other, _ = await generate(stack.aggregated, "s3", prompt, sampling(99))
    greedy, _ = await generate(stack.aggregated, "s4", prompt)
    assert first == again
    assert first != other and first != greedy


async def test_cancellation_stops_the_request_and_frees_its_kv(stack, oracle) -> None:
    prompt = embedded_prompt(oracle, stack.plane, [picture(5, 56, 56)], "go on")
    request = pb.PrefillDecodeRequest(
        request_id="x",
        model="tiny",
        prompt=prompt,
        sampling=generation_pb2.SamplingParams(max_tokens=2000, ignore_eos=True),
    )
    call = stack.aggregated.PrefillDecode(request)
    await call.read()
    assert stack.engine.load().num_running == 1 and stack.engine.load().kv_usage > 0
    call.cancel()
    for _ in range(100):
        if stack.engine.load().num_running == 0:
            break
        await asyncio.sleep(0.05)
    assert stack.engine.load() == replace(stack.engine.load(), num_running=0, kv_usage=0.0)
    release(stack.plane, prompt)


async def test_abort_ends_the_stream_with_abort(stack, oracle) -> None:
    token_ids = prompt_tokens(oracle, 0, "abort me")
    chunks = []
    async for chunk in stack.engine.generate(
        "a1", token_ids, [], Sampling(max_tokens=500, ignore_eos=True)
    ):
        chunks.append(chunk)
        if len(chunks) == 3:
            await stack.engine.abort("a1")
    assert chunks[-1].finish_reason == "abort" and len(chunks) == 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def expect_error(stub, prompt, code: grpc.StatusCode, reason: str, model="tiny") -> None:
    request = pb.PrefillDecodeRequest(request_id="bad", model=model, prompt=prompt, sampling=GREEDY)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [r async for r in stub.PrefillDecode(request)]
    assert caught.value.code() == code, caught.value.details()
    assert from_rpc_error(caught.value).reason == reason


async def test_bad_inputs_get_clear_status_codes(stack, oracle) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    prompt = embedded_prompt(oracle, stack.plane, [picture(6, 56, 56)], "describe")
    await expect_error(stack.aggregated, prompt, invalid, "WRONG_MODEL", model="llama")
    bad_grid = generation_pb2.Prompt()
    bad_grid.CopyFrom(prompt)
    bad_grid.images[0].grid.h += 2
    await expect_error(stack.aggregated, bad_grid, invalid, "EMBEDDING_SHAPE_MISMATCH")
    missing = generation_pb2.Prompt()
    missing.CopyFrom(prompt)
    missing.images[0].ClearField("embeddings")
    await expect_error(stack.aggregated, missing, invalid, "MISSING_IMAGE_DATA")
    extra = generation_pb2.Prompt()
    extra.CopyFrom(prompt)
    extra.images.append(prompt.images[0])
    await expect_error(stack.aggregated, extra, invalid, "IMAGE_COUNT_MISMATCH")
    release(stack.plane, prompt)
    await expect_error(stack.aggregated, prompt, grpc.StatusCode.NOT_FOUND, "LEASE_RELEASED")
    await expect_error(stack.aggregated, generation_pb2.Prompt(), invalid, "EMPTY_PROMPT")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.aggregated.Prefill(
            pb.PrefillRequest(request_id="p", model="tiny", prompt=prompt)
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(FailedPrecondition) as refused:
        await stack.engine.prefill("p", list(prompt.token_ids), [], Sampling())
    assert refused.value.reason == "KV_TRANSFER_DISABLED"


def sibling(engine: TransformersEngine, **options) -> TransformersEngine:
    """Another engine over the same loaded model, with other limits."""
    return TransformersEngine(
        engine.model, engine.processor, "tiny", engine.layout, replace(engine.options, **options)
    )


async def drain(
    engine: TransformersEngine,
    request_id: str,
    token_ids: list[int],
    images: list[EngineImage],
    max_tokens: int = 8,
) -> list[int]:
    sampling = Sampling(max_tokens=max_tokens, ignore_eos=True)
    return [
        t
        async for c in engine.generate(request_id, token_ids, images, sampling)
        for t in c.token_ids
    ]


async def test_admission_limits_and_kv_room(stack, oracle) -> None:
    token_ids = prompt_tokens(oracle, 0, "hello")
    busy = sibling(stack.engine, max_pending_requests=1)
    first = busy.generate("one", token_ids, [], Sampling(max_tokens=8, ignore_eos=True))
    await anext(first)
    with pytest.raises(ResourceExhausted):
        await drain(busy, "two", token_ids, [])
    with pytest.raises(InvalidArgument) as duplicate:
        await drain(busy, "one", token_ids, [])
    assert duplicate.value.reason == "DUPLICATE_REQUEST_ID"
    await first.aclose()

    per_token = stack.engine.options.kv_cache_bytes // stack.engine.budget.capacity
    room = (len(token_ids) + 8) * 3 // 2
    small = sibling(stack.engine, kv_cache_bytes=room * per_token)
    with pytest.raises(InvalidArgument) as too_big:
        await drain(small, "big", token_ids, [], max_tokens=room)
    assert too_big.value.reason == "KV_CACHE_TOO_SMALL"
    alone = await drain(small, "alone", token_ids, [])
    holder = small.generate("holder", token_ids, [], Sampling(max_tokens=8, ignore_eos=True))
    await anext(holder)
    waiter = asyncio.create_task(drain(small, "waiter", token_ids, []))
    await asyncio.sleep(0.2)
    assert small.load().num_waiting == 1 and not waiter.done()
    _ = [chunk async for chunk in holder]
    assert await asyncio.wait_for(waiter, 30) == alone
    assert small.load() == replace(small.load(), num_running=0, num_waiting=0, kv_usage=0.0)
    await asyncio.gather(busy.close(), small.close())


async def test_bad_dtype_is_refused_before_loading(tiny_model_dir) -> None:
    with pytest.raises(ValueError, match="dtype"):
        await TransformersEngine.start(tiny_model_dir, options=TransformersOptions(dtype="int8"))
