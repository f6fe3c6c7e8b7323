"""A chat with a video through Route -> Scheduler -> Encode -> Prefill (-> Decode) in one process
over real gRPC, on vLLM engines of each Qwen family's tiny checkpoint (the session's for
Qwen2-VL, ``family_engines``' for the others): the route decodes the clip once and cuts it into
chunks three encoders share, the prefill worker joins their embeddings into one video, and the
tokens equal monolithic vLLM's given the same decoded frames and their timing (its own processor
and tower), in E/PD and E/P/D, with the clip in one chunk, in two chunks on two encoders and in
four on three; and in EPD and EP/D (no encoder: an encode_prefill worker takes the route's kept
frames and plan whole, and its engine runs its own processor and tower; Qwen2.5-VL there with
``--all-families``, and LLaVA-OneVision in EPD, whose vLLM takes video as pixels only). The
clip is sampled at 1 frame a second, not the processors' 2, so Qwen2.5-VL's seconds per
temporal patch (2.0) differ from vLLM's default (1.0) and Qwen3-VL's timestamps from the
indices'."""

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
from epd.server.media.video_planner import PlannedVideo, VideoPlanner
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ImageSource
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.families import skip_unless_run
from tests.integration.registered import until_registered
from tests.pictures import picture, png
from tests.unit.models.clips import make_clip

pytestmark = pytest.mark.vllm
TEXT = "what happens in this video?"
MAX_TOKENS = 10
# 8 frames at 1 fps: every family's processor keeps all 8 (it samples 2 a second at most), 4
# temporal patches of 2 seconds each
CLIP = make_clip(num_frames=8, width=64, height=48, fps=1)
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
#: temporal patches a chunk -> the encoders that take the clip's 4 patches
CHUNKS = {1: 3, 2: 2, 64: 1}
#: topologies without encoders: an encode_prefill worker takes the video raw
RAW_TOPOLOGIES = ("epd", "ep-d")


@pytest.fixture(
    scope="module",
    params=[(f, t) for f in FAMILIES for t in ("e-pd", "e-p-d", *RAW_TOPOLOGIES)]
    + [("llava_onevision", "epd")],
    ids=lambda param: "-".join(param),
)
async def deployment(
    request, tiny_model_dir, tiny_family_dir, engines, family_engines
) -> AsyncIterator[dict[str, Any]]:
    """Three encoders, a prefill worker on the family's producer (E/PD: it serves whole
    generations) and for E/P/D a decode worker on its consumer; a route for each chunk size
    in ``CHUNKS``. EPD, EP/D: no encoder, an encode_prefill worker on the producer (handing
    its KV to a decode worker on the consumer in EP/D) and one route."""
    family, topology = request.param
    is_raw = topology in RAW_TOPOLOGIES
    if is_raw:
        skip_unless_run(request, family)
    model_dir = tiny_model_dir if family == "qwen2_vl" else tiny_family_dir(family)
    pair = engines if family == "qwen2_vl" else await family_engines(family)
    is_split = topology in ("e-p-d", "ep-d")
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    workers = [
        await build_encode_server(
            EncodeConfig(model_dir, model_id="tiny", scheduler=endpoint, worker_id=f"enc{i}")
        )
        for i in range(0 if is_raw else 3)
    ]
    mode = Role.PREFILL if is_split else Role.PREFILL_DECODE
    config = PrefillConfig(model_dir, mode=mode, scheduler=endpoint)
    if is_raw:
        config = PrefillConfig(
            model_dir, mode=Role.ENCODE_PREFILL, hands_off_kv=is_split, scheduler=endpoint
        )
    workers.append(await build_prefill_server(config, pair[0]))
    if is_split:
        workers.append(await build_decode_server(DecodeConfig(scheduler=endpoint), pair[1]))
    routes = {
        patches: await build_route_server(
            RouteConfig(model_dir, endpoint, "tiny", video_chunk_patches=patches)
        )
        for patches in ((2,) if is_raw else CHUNKS)
    }
    await until_registered(endpoint, len(workers))
    channels = {patches: create_channel(f"127.0.0.1:{r.port}") for patches, r in routes.items()}
    yield {
        "stubs": {p: route_service_pb2_grpc.RouteServiceStub(c) for p, c in channels.items()},
        "routes": routes,
        "encoders": workers[: len(workers) - 1 - is_split],
        "prefill": workers[len(workers) - 1 - is_split],
        "model_dir": model_dir,
        "engine": pair[0],
        "family": family,
    }
    for channel in channels.values():
        await channel.close()
    for route in routes.values():
        await route.stop()
    for worker in workers:
        await worker.stop()
    await scheduler.drain_and_stop(0)


def video_request(
    video: bytes, request_id: str, policy: int = scheduler_pb.ENCODER_POLICY_PER_IMAGE
) -> route_service_pb2.GenerateRequest:
    content = [
        route_service_pb2.ContentPart(video=multimodal_pb2.MediaItem(data=video)),
        route_service_pb2.ContentPart(text=TEXT),
    ]
    return route_service_pb2.GenerateRequest(
        request_id=request_id,
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=content)],
        sampling=generation_pb2.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
        encoder_policy=policy,
    )


def vllm_video_prompt(
    model_dir: Any,
    video: PlannedVideo,
    frames: np.ndarray | None = None,
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """vLLM's prompt of the chat (a video, then ``TEXT``) with ``frames`` (default: ``video``'s
    kept frames, already sampled) as its raw video, with their timing (vLLM's video metadata:
    the decoded clip's rate and frame count, the kept frames' indices) and
    ``mm_processor_kwargs``: its own processor resizes and patches them and times them
    (Qwen2.5-VL's seconds per temporal patch, Qwen3-VL's timestamps)."""
    prompt_ids = PromptBuilder(model_dir).token_ids(
        [ChatMessage("user", [ChatPart(video=ImageSource(data=b"-")), ChatPart(text=TEXT)])]
    )
    stream = video.stream
    metadata = {
        "fps": stream.fps,
        "total_num_frames": stream.num_frames,
        "duration": stream.num_frames / stream.fps,
        "frames_indices": list(video.plan.frame_indices),
        "do_sample_frames": False,
    }
    return {
        "prompt_token_ids": prompt_ids,
        "multi_modal_data": {"video": (video.frames if frames is None else frames, metadata)},
        "mm_processor_kwargs": {**(mm_processor_kwargs or {}), "do_sample_frames": False},
    }


async def vllm_reference(
    engine: Any, model_dir: Any, frames: np.ndarray, video: PlannedVideo
) -> list[int]:
    """Monolithic vLLM's greedy tokens for ``vllm_video_prompt`` with ``frames``: its own
    processor resizes, patches and times them, its tower encodes."""
    from vllm import SamplingParams

    prompt = vllm_video_prompt(model_dir, video, frames)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    final = None
    async for output in engine._llm.generate(prompt, params, f"vllm-reference-{id(frames)}"):
        final = output
    assert final is not None
    return list(final.outputs[0].token_ids)


async def test_video_tokens_equal_monolithic_vllm_on_the_same_frames(deployment) -> None:
    model_dir, engine = deployment["model_dir"], deployment["engine"]
    video = VideoPlanner(model_dir, "tiny").load(CLIP, MediaPolicy())
    assert len(video.frames) == 8 and video.plan.grid[0] == 8 // video.plan.temporal_patch_size
    expected = await vllm_reference(engine, model_dir, video.frames, video)
    # NOTE: the answer depends on the frames and their order: equal tokens mean equal embeddings.
    assert await vllm_reference(engine, model_dir, video.frames[::-1].copy(), video) != expected
    for patches, stub in deployment["stubs"].items():
        encoded_before = [len(e.worker.cache) for e in deployment["encoders"]]
        responses = [r async for r in stub.Generate(video_request(CLIP, f"video-{patches}"))]
        tokens = [t for r in responses for t in r.token_ids]
        assert tokens == expected, f"chunks of {patches} temporal patches"
        assert responses[-1].usage.completion_tokens == MAX_TOKENS
        encoders = deployment["encoders"]
        if not encoders:  # NOTE: EPD, EP/D: the worker took the route's frames whole
            assert deployment["prefill"].worker.images.videos.num_decoded == 0
            continue
        added = [len(e.worker.cache) - n for e, n in zip(encoders, encoded_before, strict=True)]
        # NOTE: the clip's chunks spread over CHUNKS[patches] encoders, each chunk encoded once
        assert sum(added) == -(-4 // patches)
        assert sum(n > 0 for n in added) == CHUNKS[patches], f"chunks of {patches}: {added}"
    for route in deployment["routes"].values():
        assert route.router.plane.held() == []
    assert all(e.worker.plane.held() == [] for e in deployment["encoders"])


async def test_a_repeated_clip_is_answered_from_the_encoders_caches(deployment) -> None:
    # NOTE: the adaptive policy sends a chunk where it is cached (per_image rotates over the
    # encoders whatever they hold).
    if not deployment["encoders"]:
        pytest.skip("no encoder: nothing is cached by chunk")
    stub, adaptive = deployment["stubs"][2], scheduler_pb.ENCODER_POLICY_ADAPTIVE
    first = [r async for r in stub.Generate(video_request(CLIP, "video-repeat-1", adaptive))]
    sizes = [len(e.worker.cache) for e in deployment["encoders"]]
    again = [r async for r in stub.Generate(video_request(CLIP, "video-repeat-2", adaptive))]
    assert [t for r in again for t in r.token_ids] == [t for r in first for t in r.token_ids]
    assert [len(e.worker.cache) for e in deployment["encoders"]] == sizes


async def test_a_bad_video_is_a_clear_error_and_holds_nothing(deployment) -> None:
    stub = deployment["stubs"][2]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [r async for r in stub.Generate(video_request(b"not a video", "video-bad"))]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == "BAD_VIDEO"
    assert deployment["routes"][2].router.plane.held() == []


async def vllm_mixed_reference(deployment: dict[str, Any], image: Any) -> list[int]:
    """Monolithic vLLM's greedy tokens for ``image``, then the clip's kept frames, then TEXT."""
    from vllm import SamplingParams

    model_dir = deployment["model_dir"]
    video = VideoPlanner(model_dir, "tiny").load(CLIP, MediaPolicy())
    prompt = vllm_video_prompt(model_dir, video)
    parts = [ChatPart(image=ImageSource(data=b"-")), ChatPart(video=ImageSource(data=b"-"))]
    prompt["prompt_token_ids"] = PromptBuilder(model_dir).token_ids(
        [ChatMessage("user", [*parts, ChatPart(text=TEXT)])]
    )
    prompt["multi_modal_data"]["image"] = image
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    final = None
    async for output in deployment["engine"]._llm.generate(prompt, params, f"mixed-{id(image)}"):
        final = output
    assert final is not None
    return list(final.outputs[0].token_ids)


async def test_an_image_and_a_video_in_one_chat_equal_monolithic_vllm(deployment) -> None:
    """A picture, then the clip, in one message: the picture's embeddings and the video's take
    their places in one prompt (encoders for both in E/PD and E/P/D; in EPD and EP/D the worker
    takes the picture's pixels and the video's frames whole) and the tokens equal monolithic
    vLLM's given the same picture and frames."""
    if deployment["family"] == "llava_onevision":
        pytest.skip("LLaVA-OneVision's vLLM takes video as pixels only; the Qwen families run it")
    image = picture(7, 56, 56)
    expected = await vllm_mixed_reference(deployment, image)
    # NOTE: the answer depends on the picture too: equal tokens mean both embeddings were used
    assert await vllm_mixed_reference(deployment, picture(8, 56, 56)) != expected
    request = video_request(CLIP, "image-and-video")
    picture_part = route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(image)))
    request.messages[0].content.insert(0, picture_part)
    responses = [r async for r in deployment["stubs"][2].Generate(request)]
    assert [t for r in responses for t in r.token_ids] == expected
    assert deployment["routes"][2].router.plane.held() == []
