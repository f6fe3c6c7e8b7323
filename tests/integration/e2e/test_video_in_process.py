"""A chat with a video through Route -> Scheduler -> Encode -> Prefill (-> Decode) in one process
over real gRPC, on the session's vLLM engines: the route decodes the clip once and cuts it into
chunks the two encoders share, the prefill worker joins their embeddings into one video, and the
tokens equal monolithic vLLM's given the same decoded frames (its own processor and tower), in
E/PD and E/P/D, with the clip in one chunk and split over the two encoders."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.common.status import from_rpc_error
from epd.scheduler.app import build_scheduler_server
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_planner import VideoPlanner
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ImageSource
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.integration.registered import until_registered
from tests.unit.models.clips import make_clip

pytestmark = pytest.mark.vllm
TEXT = "what happens in this video?"
MAX_TOKENS = 10
# 40 frames at 10 fps: the tiny model's processor keeps 8 (2 a second), 4 temporal patches
CLIP = make_clip(num_frames=40, width=64, height=48, fps=10)


@pytest.fixture(scope="module", params=["e-pd", "e-p-d"])
async def deployment(request, tiny_model_dir, engines) -> AsyncIterator[dict[str, Any]]:
    """Two encoders, a prefill worker on the session's producer (E/PD: it serves whole
    generations) and for E/P/D a decode worker on its consumer; two routes on them: chunks of 2
    temporal patches (the clip over both encoders) and of 64 (the clip as one item)."""
    is_split = request.param == "e-p-d"
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    workers = [
        await build_encode_server(
            EncodeConfig(tiny_model_dir, model_id="tiny", scheduler=endpoint, worker_id=f"enc{i}")
        )
        for i in range(2)
    ]
    mode = Role.PREFILL if is_split else Role.PREFILL_DECODE
    config = PrefillConfig(tiny_model_dir, mode=mode, scheduler=endpoint)
    workers.append(await build_prefill_server(config, engines[0]))
    if is_split:
        workers.append(await build_decode_server(DecodeConfig(scheduler=endpoint), engines[1]))
    routes = {
        patches: await build_route_server(
            RouteConfig(tiny_model_dir, endpoint, "tiny", video_chunk_patches=patches)
        )
        for patches in (2, 64)
    }
    await until_registered(endpoint, len(workers))
    channels = {patches: create_channel(f"127.0.0.1:{r.port}") for patches, r in routes.items()}
    yield {
        "stubs": {p: route_service_pb2_grpc.RouteServiceStub(c) for p, c in channels.items()},
        "routes": routes,
        "encoders": workers[:2],
    }
    for channel in channels.values():
        await channel.close()
    for route in routes.values():
        await route.stop()
    for worker in workers:
        await worker.stop()
    await scheduler.drain_and_stop(0)


def video_request(video: bytes, request_id: str) -> route_service_pb2.GenerateRequest:
    content = [
        route_service_pb2.ContentPart(video=multimodal_pb2.MediaItem(data=video)),
        route_service_pb2.ContentPart(text=TEXT),
    ]
    return route_service_pb2.GenerateRequest(
        request_id=request_id,
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=content)],
        sampling=generation_pb2.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
        encoder_policy=scheduler_pb.ENCODER_POLICY_PER_IMAGE,
    )


async def vllm_reference(engine: Any, model_dir: Any, frames: np.ndarray) -> list[int]:
    """Monolithic vLLM's greedy tokens for the chat with ``frames`` (the kept frames, already
    sampled) as its raw video: its own processor resizes and patches them, its tower encodes."""
    from vllm import SamplingParams

    prompt_ids = PromptBuilder(model_dir).token_ids(
        [ChatMessage("user", [ChatPart(video=ImageSource(data=b"-")), ChatPart(text=TEXT)])]
    )
    prompt = {
        "prompt_token_ids": prompt_ids,
        "multi_modal_data": {"video": frames},
        "mm_processor_kwargs": {"do_sample_frames": False},
    }
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    final = None
    async for output in engine._llm.generate(prompt, params, "vllm-reference-video"):
        final = output
    assert final is not None
    return list(final.outputs[0].token_ids)


async def test_video_tokens_equal_monolithic_vllm_on_the_same_frames(
    deployment, tiny_model_dir, engines
) -> None:
    frames = VideoPlanner(tiny_model_dir, "tiny").load(CLIP, MediaPolicy()).frames
    assert len(frames) == 8
    expected = await vllm_reference(engines[0], tiny_model_dir, frames)
    # NOTE: the answer depends on the frames and their order: equal tokens mean equal embeddings.
    assert await vllm_reference(engines[0], tiny_model_dir, frames[::-1].copy()) != expected
    for patches, stub in deployment["stubs"].items():
        encoded_before = [len(e.worker.cache) for e in deployment["encoders"]]
        responses = [r async for r in stub.Generate(video_request(CLIP, f"video-{patches}"))]
        tokens = [t for r in responses for t in r.token_ids]
        assert tokens == expected, f"chunks of {patches} temporal patches"
        assert responses[-1].usage.completion_tokens == MAX_TOKENS
        encoders = deployment["encoders"]
        added = [len(e.worker.cache) - n for e, n in zip(encoders, encoded_before, strict=True)]
        # NOTE: 2 chunks of 2 patches, one on each encoder; the whole clip as one item on one
        assert sorted(added) == ([1, 1] if patches == 2 else [0, 1])
    for route in deployment["routes"].values():
        assert route.router.plane.held() == []
    assert all(e.worker.plane.held() == [] for e in deployment["encoders"])


async def test_a_repeated_clip_is_answered_from_the_encoders_caches(deployment) -> None:
    stub = deployment["stubs"][2]
    first = [r async for r in stub.Generate(video_request(CLIP, "video-repeat-1"))]
    sizes = [len(e.worker.cache) for e in deployment["encoders"]]
    again = [r async for r in stub.Generate(video_request(CLIP, "video-repeat-2"))]
    assert [t for r in again for t in r.token_ids] == [t for r in first for t in r.token_ids]
    assert [len(e.worker.cache) for e in deployment["encoders"]] == sizes


async def test_a_bad_video_is_a_clear_error_and_holds_nothing(deployment) -> None:
    stub = deployment["stubs"][2]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [r async for r in stub.Generate(video_request(b"not a video", "video-bad"))]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == "BAD_VIDEO"
    assert deployment["routes"][2].router.plane.held() == []
