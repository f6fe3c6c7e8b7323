"""Route -> Scheduler -> encode_prefill worker (-> decode worker) in one process over real gRPC,
on the session's vLLM engines: EPD and EP/D decode and hash each image and each video once per
deployment, in the route. The worker reads the pixels (a video's kept frames) the route shared,
tagged with the item's mm_hash, and names the picture (the video) by it for vLLM, which hashes no
pixels either; the image's answer equals the transformers reference token for token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.scheduler.app import build_scheduler_server
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.engine.reference import ReferenceEngine
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import route_service_pb2_grpc
from tests.integration.e2e.route_epd_deployment import (
    chat_request,
    count_decodes_and_hashes,
    counted,
)
from tests.integration.registered import until_registered
from tests.pictures import picture, png

pytestmark = pytest.mark.vllm


@pytest.fixture(params=["epd", "ep-d"])
async def deployment(request, tiny_model_dir, engines) -> AsyncIterator[dict[str, Any]]:
    """A route, a scheduler and an encode_prefill worker on the session's producer engine; for
    EP/D also a decode worker on its consumer."""
    is_split = request.param == "ep-d"
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    config = PrefillConfig(
        tiny_model_dir, mode=Role.ENCODE_PREFILL, hands_off_kv=is_split, scheduler=endpoint
    )
    prefill = await build_prefill_server(config, engines[0])
    workers = [prefill]
    if is_split:
        workers.append(await build_decode_server(DecodeConfig(scheduler=endpoint), engines[1]))
    route = await build_route_server(RouteConfig(tiny_model_dir, endpoint, "tiny"))
    await until_registered(endpoint, len(workers))
    channel = create_channel(f"127.0.0.1:{route.port}")
    yield {
        "stub": route_service_pb2_grpc.RouteServiceStub(channel),
        "route": route,
        "prefill": prefill,
    }
    await channel.close()
    await route.stop()
    for worker in reversed(workers):
        await worker.stop()
    await scheduler.drain_and_stop(0)


async def test_each_image_is_decoded_and_hashed_once_in_the_deployment(
    deployment, tiny_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.multimodal.hasher import MultiModalHasher

    counts = count_decodes_and_hashes(monkeypatch)
    vllm_hash = staticmethod(counted(counts, "vllm hash", MultiModalHasher.hash_kwargs))
    monkeypatch.setattr(MultiModalHasher, "hash_kwargs", vllm_hash)
    image = picture(41, 300, 260)
    request = chat_request([image], "describe", max_tokens=4, ignore_eos=True)
    responses = [r async for r in deployment["stub"].Generate(request)]
    tokens = [t for r in responses for t in r.token_ids]
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}
    ]
    expected = ReferenceEngine(tiny_model_dir).generate(
        messages, [image], max_tokens=4, ignore_eos=True
    )
    assert tokens == expected.token_ids
    assert counts == {"decode": 1, "hash": 1}, "the route's decode and hash, and nobody else's"
    assert deployment["prefill"].worker.images.loader.num_decoded == 0
    assert deployment["route"].router.plane.held() == [], "the route released the pixels"


async def test_each_video_is_decoded_and_hashed_once_in_the_deployment(
    deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route decodes, plans and hashes a clip (and a picture beside it); the encode_prefill
    worker takes its kept frames from the route's segment, and vLLM takes them as frames named
    by the video's hash: no decode, plan or hash of them anywhere else."""
    from vllm.multimodal.hasher import MultiModalHasher

    from epd.server.media import video_planner
    from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2
    from tests.unit.models.clips import make_clip

    counts = count_decodes_and_hashes(monkeypatch)
    for name in ("decode_video", "video_hash"):
        monkeypatch.setattr(
            video_planner, name, counted(counts, name, getattr(video_planner, name))
        )
    hash_kwargs = MultiModalHasher.hash_kwargs

    def hash_of(*args: Any, **kwargs: Any) -> str:
        # NOTE: with the processor's do_sample_frames, vLLM hashes the video's name (a string)
        # with it; a hash of the frames themselves is what must not happen.
        if not isinstance(kwargs.get("video", ""), str):
            counts["vllm frames hash"] += 1
        return hash_kwargs(*args, **kwargs)

    monkeypatch.setattr(MultiModalHasher, "hash_kwargs", staticmethod(hash_of))
    still = png(picture(42, 64, 64))
    content = [
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=still)),
        route_service_pb2.ContentPart(video=multimodal_pb2.MediaItem(data=make_clip(fps=4))),
        route_service_pb2.ContentPart(text="what happens?"),
    ]
    request = route_service_pb2.GenerateRequest(
        request_id="video-once",
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=content)],
        sampling=generation_pb2.SamplingParams(max_tokens=4, ignore_eos=True),
    )
    responses = [r async for r in deployment["stub"].Generate(request)]
    assert sum(len(r.token_ids) for r in responses) == 4
    once = {"decode": 1, "hash": 1, "decode_video": 1, "video_hash": 1}
    assert counts == once, "the route's, and nobody else's"
    assert deployment["prefill"].worker.images.videos.num_decoded == 0
    assert deployment["route"].router.plane.held() == [], "the route released the frames"
