"""Both references on the same decoded frames, and epd on both engines: monolithic vLLM and
transformers' ``generate`` answer a chat with a video, and epd answers it through E/PD (the clip
split over two encoders) on a vLLM engine and on the transformers engine. epd on vLLM gives
vLLM's tokens and epd on transformers gives transformers' tokens, always; vLLM and transformers
agree with each other only while the video's temporal positions stay within its spatial extent.

Why (docs/video.md, "Two references"): after a video, vLLM 0.32 starts the next text at the
largest position the video took + 1 (``get_mrope_input_positions``), transformers 5.19 at the
video's first position + max(h, w) / merge (``get_rope_index``), whatever the temporal positions
reached. Qwen2-VL's temporal positions step by 1 a temporal patch and Qwen2.5-VL's by
``second_per_grid_ts`` x ``tokens_per_second``, so a clip whose last temporal position reaches
max(h, w) / merge puts the text at different positions; Qwen3-VL gives each temporal patch its
own grid of t = 1, so its two references never part.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_planner import VideoPlanner
from epd.server.models.video import VideoPlan
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import route_service_pb2_grpc
from tests.families import skip_unless_run
from tests.integration.e2e.test_video_in_process import video_request, vllm_reference
from tests.integration.e2e.test_video_transformers import transformers_reference
from tests.integration.registered import until_registered
from tests.unit.models.clips import make_clip

pytestmark = pytest.mark.vllm
#: 112 x 112 frames at 2 fps, kept at 2 fps: 8 x 8 patches a frame, 4 x 4 after the merge
SHORT = make_clip(num_frames=4, width=112, height=112, fps=2)  # 2 temporal patches
LONG = make_clip(num_frames=10, width=112, height=112, fps=2)  # 5 temporal patches
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


async def start_e_pd(model_dir: Path, engine: Any, stack: AsyncExitStack) -> Any:
    """E/PD on ``engine`` (two encoders, one temporal patch a chunk); its route's stub. The
    stack stops it all."""
    scheduler, scheduler_port = await build_scheduler_server()
    stack.push_async_callback(scheduler.drain_and_stop, 0)
    endpoint = f"127.0.0.1:{scheduler_port}"
    configs = [
        EncodeConfig(model_dir, model_id="tiny", scheduler=endpoint, worker_id=f"enc{i}")
        for i in range(2)
    ]
    workers = [await build_encode_server(config) for config in configs]
    config = PrefillConfig(model_dir, mode=Role.PREFILL_DECODE, scheduler=endpoint)
    workers.append(await build_prefill_server(config, engine))
    for worker in workers:
        stack.push_async_callback(worker.stop)
    route = await build_route_server(
        RouteConfig(model_dir, endpoint, "tiny", video_chunk_patches=1)
    )
    stack.push_async_callback(route.stop)
    await until_registered(endpoint, len(workers))
    channel = create_channel(f"127.0.0.1:{route.port}")
    stack.push_async_callback(channel.close)
    return route_service_pb2_grpc.RouteServiceStub(channel)


@pytest.fixture(scope="module", params=FAMILIES)
async def deployments(
    request, tiny_model_dir, tiny_family_dir, engines, family_engines
) -> AsyncIterator[dict[str, Any]]:
    """E/PD on the family's vLLM producer and E/PD on a transformers engine of the same
    checkpoint."""
    family = request.param
    skip_unless_run(request, family)
    model_dir = tiny_model_dir if family == "qwen2_vl" else tiny_family_dir(family)
    pair = engines if family == "qwen2_vl" else await family_engines(family)
    async with AsyncExitStack() as stack:
        transformers = await TransformersEngine.start(model_dir, model_id="tiny")
        stack.push_async_callback(transformers.close)
        yield {
            "family": family,
            "model_dir": model_dir,
            "vllm_engine": pair[0],
            "vllm": await start_e_pd(model_dir, pair[0], stack),
            "transformers": await start_e_pd(model_dir, transformers, stack),
        }


def positions_part(family: str, model_dir: Path, plan: VideoPlan) -> bool:
    """Whether vLLM 0.32 and transformers 5.19 start the text after this video at different
    positions: its last temporal position, (t - 1) x the step, reaches max(h, w) / merge."""
    if family == "qwen3_vl":
        return False
    vision = json.loads((model_dir / "config.json").read_text())["vision_config"]
    merge = vision["spatial_merge_size"]
    step = 1.0
    if plan.seconds_per_temporal_patch is not None:
        step = plan.seconds_per_temporal_patch * vision["tokens_per_second"]
    num_patches, height, width = plan.grid
    return int((num_patches - 1) * step) >= max(height, width) // merge


async def epd_tokens(stub: Any, clip: bytes, request_id: str) -> list[int]:
    """epd's tokens for the chat with ``clip``."""
    responses = [r async for r in stub.Generate(video_request(clip, request_id))]
    return [t for r in responses for t in r.token_ids]


@pytest.mark.parametrize("name", ["short", "long"])
async def test_each_engine_answers_as_its_reference_and_the_references_part_as_documented(
    deployments, name: str
) -> None:
    family, model_dir = deployments["family"], deployments["model_dir"]
    clip = SHORT if name == "short" else LONG
    video = VideoPlanner(model_dir, "tiny").load(clip, MediaPolicy())
    by_vllm = await vllm_reference(deployments["vllm_engine"], model_dir, video.frames, video)
    by_transformers = transformers_reference(model_dir, clip)
    assert await epd_tokens(deployments["vllm"], clip, f"vllm-{name}") == by_vllm
    assert await epd_tokens(deployments["transformers"], clip, f"tf-{name}") == by_transformers
    parts = positions_part(family, model_dir, video.plan)
    assert parts == (name == "long" and family != "qwen3_vl"), video.plan.grid
    assert (by_vllm != by_transformers) == parts, (by_vllm, by_transformers)
