"""A chat with a video through Route -> Scheduler -> Encode -> Prefill on the transformers engine,
in one process over real gRPC (E/PD), for every Qwen family: the clip split over two encoders,
the prefill worker's engine expanding the video's token (Qwen3-VL: each temporal patch's
"<t seconds>" text, then its rows between vision start and end), placing the joined rows at the
video tokens (Qwen3-VL's DeepStack levels too) with the family's M-RoPE positions (Qwen2.5-VL's
seconds per temporal patch included), answered token for token as transformers' generate
answers given the same kept frames and their timing. LLaVA-OneVision too: each frame through the
tower and pooled 2 x 2 on the encoders, the joined rows and the video's one newline row (the
engine's) at the video tokens, 1-D positions. And in EPD (no encoder): an encode_prefill worker
takes the route's kept frames and plan whole, and its engine runs the family's video processor
and tower on them. (The transformers engine serves no P/D split: it has no KV hand-off, so E/P/D
and EP/D are vLLM's alone.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_planner import VideoPlanner
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import route_service_pb2_grpc
from tests.integration.e2e.test_video_in_process import CLIP, MAX_TOKENS, TEXT, video_request
from tests.integration.registered import until_registered

#: temporal patches a chunk, so that the clip's 8 frames make two chunks (LLaVA-OneVision's
#: temporal patch is one frame; the Qwen families' two)
CHUNK_PATCHES = {"qwen2_vl": 2, "qwen2_5_vl": 2, "qwen3_vl": 2, "llava_onevision": 4}


@pytest.fixture(
    scope="module",
    params=[(f, t) for f in CHUNK_PATCHES for t in ("e-pd", "epd")],
    ids=lambda param: "-".join(param),
)
async def deployment(
    request: pytest.FixtureRequest, tiny_family_dir: Callable[[str], Path]
) -> AsyncIterator[dict[str, Any]]:
    """Two encoders, a prefill worker on a transformers engine, a route cutting the clip into
    two chunks (one on each encoder); EPD: an encode_prefill worker alone."""
    family, topology = request.param
    is_raw = topology == "epd"
    model_dir = tiny_family_dir(family)
    engine = await TransformersEngine.start(model_dir, model_id="tiny")
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    workers = [
        await build_encode_server(
            EncodeConfig(model_dir, model_id="tiny", scheduler=endpoint, worker_id=f"enc{i}")
        )
        for i in range(0 if is_raw else 2)
    ]
    mode = Role.ENCODE_PREFILL if is_raw else Role.PREFILL_DECODE
    config = PrefillConfig(model_dir, mode=mode, scheduler=endpoint)
    workers.append(await build_prefill_server(config, engine))
    route = await build_route_server(
        RouteConfig(model_dir, endpoint, "tiny", video_chunk_patches=CHUNK_PATCHES[family])
    )
    await until_registered(endpoint, len(workers))
    channel = create_channel(f"127.0.0.1:{route.port}")
    yield {
        "stub": route_service_pb2_grpc.RouteServiceStub(channel),
        "model_dir": model_dir,
        "encoders": workers[:-1],
        "prefill": workers[-1],
    }
    await channel.close()
    await route.stop()
    for worker in workers:
        await worker.stop()
    await scheduler.drain_and_stop(0)
    await engine.close()


def transformers_reference(model_dir: Path, clip: bytes = CLIP) -> list[int]:
    """transformers' greedy generate on the chat with ``clip``'s kept frames (as the route
    plans them) and their metadata."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.video_utils import VideoMetadata

    video = VideoPlanner(model_dir, "tiny").load(clip, MediaPolicy())
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    chat = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": TEXT}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    stream = video.stream
    metadata = VideoMetadata(
        total_num_frames=stream.num_frames,
        fps=stream.fps,
        frames_indices=list(video.plan.frame_indices),
    )
    inputs = processor(
        text=[text],
        videos=[video.frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
    )
    with torch.inference_mode():
        out = model.generate(
            **inputs, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False
        )
    return [int(t) for t in out[0, inputs["input_ids"].shape[1] :]]


async def test_video_tokens_equal_transformers_on_the_same_frames(deployment) -> None:
    expected = transformers_reference(deployment["model_dir"])
    sizes = [len(e.worker.cache) for e in deployment["encoders"]]
    responses = [r async for r in deployment["stub"].Generate(video_request(CLIP, "tf-video"))]
    assert [t for r in responses for t in r.token_ids] == expected
    if not deployment["encoders"]:  # NOTE: EPD: the worker took the route's frames whole
        assert deployment["prefill"].worker.images.videos.num_decoded == 0
        return
    added = [len(e.worker.cache) - n for e, n in zip(deployment["encoders"], sizes, strict=True)]
    assert added == [1, 1], "the clip's two chunks, one on each encoder"
