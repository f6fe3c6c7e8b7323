"""A video under overridden sampling and pixel budget (vLLM 0.32's ``mm_processor_kwargs``)
through Route -> Scheduler -> Encode -> Prefill+Decode in one process on a family's vLLM engine,
token-exact against monolithic vLLM given the same kept frames, their timing and the same
``mm_processor_kwargs``: once as the route's ``--mm-processor-kwargs`` (a gRPC request), once
in an OpenAI body on a route started with ``--trust-request-mm-kwargs``. The override samples
the clip at 0.5 frames a second (4 of its 8 frames, so Qwen2.5-VL's seconds per temporal patch
and Qwen3-VL's timestamps move too) and lifts the pixel floor, so every family's grid and token
count differ from the checkpoint's; the clip is split over two encoders."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_overrides import MediaKwargs
from epd.server.media.video_planner import PlannedVideo
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from tests.families import skip_unless_run
from tests.integration.e2e.test_video_in_process import TEXT, vllm_video_prompt
from tests.integration.registered import until_registered
from tests.unit.models.clips import make_clip

pytestmark = pytest.mark.vllm
MAX_TOKENS = 10
CLIP = make_clip(num_frames=8, width=64, height=48, fps=1)
SAMPLING = {"fps": 0.5}
PIXELS = {"min_pixels": 20000}


@pytest.fixture(
    scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"], ids=lambda family: family
)
async def deployment(
    request, tiny_model_dir, tiny_family_dir, engines, family_engines
) -> AsyncIterator[dict[str, Any]]:
    """E/PD with two encoders; a route with the override as its flags (gRPC) and a trusting
    route whose requests bring it (HTTP)."""
    family = request.param
    skip_unless_run(request, family)
    model_dir = tiny_model_dir if family == "qwen2_vl" else tiny_family_dir(family)
    pair = engines if family == "qwen2_vl" else await family_engines(family)
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    workers = [
        await build_encode_server(
            EncodeConfig(model_dir, model_id="tiny", scheduler=endpoint, worker_id=f"enc{i}")
        )
        for i in range(2)
    ]
    config = PrefillConfig(model_dir, mode=Role.PREFILL_DECODE, scheduler=endpoint)
    workers.append(await build_prefill_server(config, pair[0]))
    flagged = MediaPolicy(mm_processor_kwargs={**SAMPLING, "videos_kwargs": PIXELS})
    server = await build_route_server(
        RouteConfig(model_dir, endpoint, "tiny", media=flagged, video_chunk_patches=1)
    )
    trusting = await build_route_server(
        RouteConfig(
            model_dir,
            endpoint,
            "tiny",
            http_port=0,
            media=MediaPolicy(trust_request_mm_kwargs=True),
            video_chunk_patches=1,
        )
    )
    await until_registered(endpoint, len(workers))
    channel = create_channel(f"127.0.0.1:{server.port}")
    assert trusting.http is not None
    yield {
        "stub": route_service_pb2_grpc.RouteServiceStub(channel),
        "url": f"http://127.0.0.1:{trusting.http.port}/v1",
        "trusting": trusting,
        "encoders": workers[:2],
        "model_dir": model_dir,
        "engine": pair[0],
    }
    await channel.close()
    for route in (server, trusting):
        await route.stop()
    for worker in workers:
        await worker.stop()
    await scheduler.drain_and_stop(0)


async def vllm_reference(engine: Any, model_dir: Any, video: PlannedVideo) -> list[int]:
    """Monolithic vLLM's greedy tokens for the chat with ``video``'s kept frames as its raw
    video, their timing as vLLM's video metadata, and the pixel budget as the request's
    ``mm_processor_kwargs``: its processor resizes, patches and times them, its tower
    encodes."""
    from vllm import SamplingParams

    prompt = vllm_video_prompt(model_dir, video, mm_processor_kwargs=PIXELS)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    final = None
    async for output in engine._llm.generate(prompt, params, f"vllm-override-{id(video)}"):
        final = output
    assert final is not None
    return list(final.outputs[0].token_ids)


async def test_an_overridden_video_is_token_exact_through_both_forms(deployment) -> None:
    loader = deployment["trusting"].router.videos
    overrides = loader.overrides(MediaKwargs({**SAMPLING, **PIXELS}), has_images=False)
    video = await loader.load(data=CLIP, overrides=overrides)
    default = await loader.load(data=CLIP)
    assert len(video.frames) == 4 and video.plan.grid != default.plan.grid
    expected = await vllm_reference(deployment["engine"], deployment["model_dir"], video)

    content = [
        route_service_pb2.ContentPart(video=multimodal_pb2.MediaItem(data=CLIP)),
        route_service_pb2.ContentPart(text=TEXT),
    ]
    flagged = route_service_pb2.GenerateRequest(
        request_id="override-flags",
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=content)],
        sampling=generation_pb2.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
    )
    responses = [r async for r in deployment["stub"].Generate(flagged)]
    assert [t for r in responses for t in r.token_ids] == expected

    url = "data:video/mp4;base64," + base64.b64encode(CLIP).decode()
    body = {
        "model": "tiny",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": url}},
                    {"type": "text", "text": TEXT},
                ],
            }
        ],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "mm_processor_kwargs": {**SAMPLING, **PIXELS},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{deployment['url']}/chat/completions", json=body) as response,
    ):
        answer = await response.json()
    assert response.status == 200, answer
    assert answer["choices"][0]["token_ids"] == expected
    # NOTE: the same body without the override is another video: other tokens
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{deployment['url']}/chat/completions",
            json={k: v for k, v in body.items() if k != "mm_processor_kwargs"},
        ) as response,
    ):
        plain = await response.json()
    assert plain["choices"][0]["token_ids"] != expected
