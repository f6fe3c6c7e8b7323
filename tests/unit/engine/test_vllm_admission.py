"""VllmEngine's admission and abort rules, on a fake AsyncLLM (no engine is started).

At most ``max_pending_requests`` requests run at once (more: RESOURCE_EXHAUSTED ``ENGINE_BUSY``;
over gRPC: tests/grpc/prefill/test_engine_busy.py); a request that ends, is cancelled or whose
stream is closed early frees its slot, and the cancelled ones are aborted in the engine; a request
id already running is ``DUPLICATE_REQUEST_ID``; a failed or closed engine is UNAVAILABLE
``ENGINE_DEAD``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from PIL import Image

from epd.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from epd.server.engine.base import KV_LOAD_FAILED, EngineImage, Sampling, TokenChunk
from epd.server.engine.prompt_check import VisionLayout
from epd.server.engine.vllm_embeds import EMBEDS_HASH_PREFIX
from epd.server.engine.vllm_engine import VllmEngine
from epd.server.engine.vllm_inputs import PICTURE_NAME_PREFIX
from epd.server.engine.vllm_options import VllmOptions
from epd.server.models.registry import family_named
from tests.engines import QWEN_LAYOUT as LAYOUT

# NOTE: the engine builds vLLM's SamplingParams and catches vLLM's client errors.
pytest.importorskip("vllm")

PROMPT = [1, 2, 3]
SAMPLING = Sampling(max_tokens=4, ignore_eos=True)


def output(token_id: int, finished: bool, reason: str = "length") -> SimpleNamespace:
    """A delta RequestOutput as vLLM streams it; ``reason`` ends it when ``finished``."""
    completion = SimpleNamespace(
        token_ids=[token_id], finish_reason=reason if finished else None, logprobs=None
    )
    return SimpleNamespace(
        outputs=[completion],
        finished=finished,
        prompt_token_ids=PROMPT,
        num_cached_tokens=0,
        prompt_logprobs=None,
    )


class FakeLlm:
    """Stands in for AsyncLLM: each request yields one token, then waits for ``release``."""

    def __init__(self) -> None:
        self.errored = False
        self.started: list[str] = []
        self.aborted: list[str] = []
        self.release = asyncio.Event()
        self.final_reason = "length"
        self.is_shut_down = False
        self.prompts: list[dict[str, Any]] = []
        self.priorities: list[int] = []
        self.injected: list[dict[str, list[str]]] = []
        self.input_processor = SimpleNamespace(
            inject_into_mm_cache=lambda hashes, kwargs: self.injected.append(hashes)
        )
        self.model_config = SimpleNamespace(is_encoder_decoder=False)
        self.rendered: list[dict[str, Any]] = []
        self.renderer = SimpleNamespace(render_cmpl_async=self._render)

    async def _render(self, prompts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """vLLM's renderer: what it was given, marked rendered."""
        self.rendered.extend(prompts)
        return [{**prompt, "type": "rendered"} for prompt in prompts]

    async def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str, priority: int = 0
    ) -> AsyncIterator[SimpleNamespace]:
        self.started.append(request_id)
        self.prompts.append(prompt)
        self.priorities.append(priority)
        yield output(7, finished=False)
        await self.release.wait()
        yield output(8, finished=True, reason=self.final_reason)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def shutdown(self, timeout: float | None = None) -> None:
        self.is_shut_down = True
        self.shutdown_timeout = timeout


@pytest.fixture
def llm() -> FakeLlm:
    return FakeLlm()


@pytest.fixture
def engine(llm: FakeLlm) -> VllmEngine:
    return VllmEngine(llm, "tiny", LAYOUT, VllmOptions(max_pending_requests=2))


class Consumer:
    """One request consumed in a task: ``first`` is set once the engine admitted it."""

    def __init__(self, engine: VllmEngine, request_id: str) -> None:
        self.chunks: list[TokenChunk] = []
        self.first = asyncio.Event()
        self.task = asyncio.create_task(self._consume(engine, request_id))

    async def _consume(self, engine: VllmEngine, request_id: str) -> None:
        async for chunk in engine.generate(request_id, PROMPT, [], SAMPLING):
            self.chunks.append(chunk)
            self.first.set()

    async def admitted(self) -> None:
        await asyncio.wait_for(self.first.wait(), timeout=5)

    async def cancel(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def running(engine: VllmEngine, *request_ids: str) -> list[Consumer]:
    consumers = [Consumer(engine, request_id) for request_id in request_ids]
    for consumer in consumers:
        await consumer.admitted()
    return consumers


async def first_chunk(
    engine: VllmEngine,
    request_id: str,
    prompt: list[int] = PROMPT,
    images: list[EngineImage] | None = None,
) -> TokenChunk:
    """Start ``request_id`` and return its first chunk (raises what admission raises)."""
    stream = engine.generate(request_id, prompt, images or [], SAMPLING)
    try:
        return await anext(stream)
    finally:
        await stream.aclose()


async def test_requests_beyond_the_limit_are_engine_busy(engine, llm) -> None:
    consumers = await running(engine, "a", "b")
    assert engine.load().num_running == 2
    with pytest.raises(ResourceExhausted) as caught:
        await first_chunk(engine, "c")
    assert caught.value.reason == "ENGINE_BUSY"
    assert llm.started == ["a", "b"], "a refused request never reaches the engine"
    for consumer in consumers:
        await consumer.cancel()


async def test_a_cancelled_consumer_aborts_its_request_and_frees_its_slot(engine, llm) -> None:
    first, second = await running(engine, "a", "b")
    await first.cancel()
    assert llm.aborted == ["a"]
    assert engine.load().num_running == 1
    (third,) = await running(engine, "c")
    assert llm.started == ["a", "b", "c"]
    for consumer in (second, third):
        await consumer.cancel()
    assert llm.aborted == ["a", "b", "c"]
    assert engine.load().num_running == 0


async def test_a_stream_closed_early_aborts_its_request(engine, llm) -> None:
    stream = engine.generate("a", PROMPT, [], SAMPLING)
    assert (await anext(stream)).token_ids == [7]
    await stream.aclose()
    assert llm.aborted == ["a"]
    assert engine.load().num_running == 0


async def test_a_decode_stream_closed_early_aborts_its_request(llm) -> None:
    options = VllmOptions(max_pending_requests=2, kv_role="kv_consumer")
    engine = VllmEngine(llm, "tiny", LAYOUT, options)
    stream = engine.decode(
        "d", PROMPT, SAMPLING, first_token_id=7, kv_transfer_params={"do_remote_prefill": True}
    )
    assert (await anext(stream)).token_ids == [], "the resampled first token is dropped"
    await stream.aclose()
    assert llm.aborted == ["d"]
    assert engine.load().num_running == 0


@pytest.mark.parametrize("seed", ["7", 7.5, True, [7]])
async def test_a_handle_with_a_malformed_seed_is_refused_before_the_engine_runs(
    llm, seed: object
) -> None:
    options = VllmOptions(max_pending_requests=2, kv_role="kv_consumer")
    engine = VllmEngine(llm, "tiny", LAYOUT, options)
    handle = {"do_remote_prefill": True, "epd_seed": seed}
    stream = engine.decode("d", PROMPT, SAMPLING, first_token_id=7, kv_transfer_params=handle)
    with pytest.raises(InvalidArgument) as caught:
        await anext(stream)
    assert caught.value.reason == "BAD_KV_HANDLE"
    assert llm.started == [] and engine.load().num_running == 0


async def test_finished_requests_leave_room_and_are_not_aborted(engine, llm) -> None:
    consumers = await running(engine, "a", "b")
    llm.release.set()
    await asyncio.gather(*(consumer.task for consumer in consumers))
    assert [t for c in consumers[0].chunks for t in c.token_ids] == [7, 8]
    assert consumers[0].chunks[-1].finish_reason == "length"
    assert engine.load().num_running == 0 and llm.aborted == []
    await asyncio.gather(*(first_chunk(engine, request_id) for request_id in ("c", "d")))


async def test_a_running_request_id_is_a_duplicate(engine, llm) -> None:
    (consumer,) = await running(engine, "a")
    with pytest.raises(InvalidArgument) as caught:
        await first_chunk(engine, "a")
    assert caught.value.reason == "DUPLICATE_REQUEST_ID"
    assert llm.started == ["a"] and llm.aborted == []
    assert engine.load().num_running == 1, "the refusal leaves the running request alone"
    await consumer.cancel()


async def test_a_failed_or_closed_engine_is_dead(engine, llm) -> None:
    llm.errored = True
    with pytest.raises(Unavailable) as caught:
        await first_chunk(engine, "a")
    assert caught.value.reason == "ENGINE_DEAD"
    llm.errored = False
    await engine.close()
    assert llm.is_shut_down
    with pytest.raises(Unavailable) as caught:
        await first_chunk(engine, "b")
    assert caught.value.reason == "ENGINE_DEAD"
    assert llm.started == []


async def test_embeddings_and_pictures_go_through_vllms_renderer(engine, llm) -> None:
    llm.release.set()
    grid_prompt = [1, 5, 6, 7]
    embedded = [EngineImage("h", (1, 2, 4), embeddings=torch.ones(2, 8))]
    await first_chunk(engine, "a", grid_prompt, embedded)
    public = llm.rendered[-1]
    assert public["prompt_token_ids"] == grid_prompt, "vLLM's renderer expands the placeholder"
    assert public["multi_modal_data"]["image"]["image_grid_thw"].tolist() == [[1, 2, 4]]
    assert public["multi_modal_uuids"]["image"][0].startswith(EMBEDS_HASH_PREFIX)
    assert llm.prompts[-1] == {**public, "type": "rendered"} and llm.injected == []
    picture = Image.new("RGB", (8, 8))
    await first_chunk(engine, "b", grid_prompt, [EngineImage("p", image=picture)])
    assert llm.rendered[-1] == {
        "prompt_token_ids": grid_prompt,
        "multi_modal_data": {"image": [picture]},
        "multi_modal_uuids": {"image": [f"{PICTURE_NAME_PREFIX}p"]},
    }, "a picture is named by its mm_hash: vLLM does not hash its pixels again"
    await first_chunk(engine, "c", grid_prompt, [EngineImage("", image=picture)])
    assert "multi_modal_uuids" not in llm.rendered[-1], "unnamed: vLLM hashes it"


async def test_a_family_with_items_of_its_own_skips_the_renderer(llm) -> None:
    """LLaVA-OneVision gives its items itself (vLLM 0.32 batches its embeddings wrongly): the
    engine takes them rendered, through vLLM's processor cache."""
    layout = VisionLayout(
        None, 6, merge_size=1, embedding_width=8, family=family_named("llava_onevision")
    )
    engine = VllmEngine(llm, "tiny", layout, VllmOptions())
    llm.release.set()
    await first_chunk(engine, "a", [1, 6, 7], [EngineImage("h", (1, 1, 2), torch.ones(2, 8))])
    rendered = llm.prompts[-1]
    assert rendered["type"] == "multimodal" and rendered["prompt_token_ids"] == [1, 6, 6, 7]
    assert llm.injected == [rendered["mm_hashes"]] and llm.rendered == []


async def test_more_images_than_the_engine_takes_are_refused(llm) -> None:
    engine = VllmEngine(llm, "tiny", LAYOUT, VllmOptions(max_images_per_prompt=2))
    images = [EngineImage(f"h{i}", (1, 2, 2), embeddings=torch.ones(1, 8)) for i in range(3)]
    with pytest.raises(InvalidArgument) as caught:
        await first_chunk(engine, "a", [1, *[5, 6, 7] * 3], images)
    assert caught.value.reason == "TOO_MANY_IMAGES"
    assert llm.started == [] and engine.load().num_running == 0


async def test_more_videos_than_the_engine_takes_are_refused_apart_from_images(llm) -> None:
    layout = VisionLayout(
        5, 6, merge_size=2, embedding_width=8, family=family_named("qwen2_vl"), video_pad_id=9
    )
    options = VllmOptions(max_images_per_prompt=1, max_videos_per_prompt=1)
    engine = VllmEngine(llm, "tiny", layout, options)
    image = EngineImage("i", (1, 2, 2), embeddings=torch.ones(1, 8))
    video = EngineImage("v", (1, 2, 2), torch.ones(1, 8), seconds_per_temporal_patch=0.0)
    with pytest.raises(InvalidArgument) as caught:
        await first_chunk(engine, "a", [1, 5, 6, 5, 9, 5, 9], [image, video, video])
    assert caught.value.reason == "TOO_MANY_VIDEOS"
    assert llm.started == [] and engine.load().num_running == 0


async def test_a_request_vllm_finishes_with_an_error_fails_unavailable(llm) -> None:
    """vLLM's retryable request-level error (e.g. a KV load failure) is not a finished answer."""
    llm.final_reason = "error"
    llm.release.set()
    options = VllmOptions(max_pending_requests=2, kv_role="kv_consumer")
    engine = VllmEngine(llm, "tiny", LAYOUT, options)
    kv = {"do_remote_prefill": True}
    with pytest.raises(Unavailable) as caught:
        [c async for c in engine.decode("d", PROMPT, SAMPLING, 7, kv_transfer_params=kv)]
    assert caught.value.reason == KV_LOAD_FAILED
    with pytest.raises(Unavailable) as caught:
        [c async for c in engine.generate("g", PROMPT, [], SAMPLING)]
    assert caught.value.reason == "ENGINE_REQUEST_FAILED"
    assert engine.load().num_running == 0 and llm.aborted == []


async def test_the_priority_cache_salt_and_prompt_logprobs_reach_vllm(engine, llm) -> None:
    llm.release.set()
    logprob = SimpleNamespace(logprob=-0.5, rank=2, decoded_token="b")
    first = output(7, finished=False)
    first.prompt_logprobs = [None, {2: logprob}, {3: logprob}]
    seen = []

    async def generate(
        prompt: dict[str, Any], params: Any, request_id: str, priority: int = 0
    ) -> AsyncIterator[SimpleNamespace]:
        llm.prompts.append(prompt)
        llm.priorities.append(priority)
        seen.append(params)
        yield first
        yield output(8, finished=True)

    llm.generate = generate
    sampling = Sampling(
        max_tokens=2, prompt_logprobs=1, skip_special_tokens=False, priority=-3, cache_salt="t1"
    )
    chunks = [chunk async for chunk in engine.generate("a", PROMPT, [], sampling)]
    assert llm.priorities == [-3] and llm.prompts[-1]["cache_salt"] == "t1"
    assert (seen[0].prompt_logprobs, seen[0].skip_special_tokens) == (1, False)
    assert chunks[0].prompt_logprobs == [(), ((2, -0.5, 2, "b"),), ((3, -0.5, 2, "b"),)]
    assert chunks[1].prompt_logprobs == [], "the prompt's logprobs come once"
    await first_chunk(engine, "b")
    assert "cache_salt" not in llm.prompts[-1], "no salt: the prompt as it was"
