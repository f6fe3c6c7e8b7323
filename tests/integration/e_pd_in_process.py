"""E/PD in one process over real gRPC around a given engine: a scheduler, an encoder, a
prefill+decode worker and a route, asked text around two images of different sizes; and what
transformers' generate answers to the same chat on the same checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

from epd.common.channels import create_channel
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.engine.base import Engine
from epd.server.engine.reference import ReferenceEngine
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc
from tests.pictures import picture, png

NUM_TOKENS = 12
IMAGES = (picture(11, 96, 64), picture(12, 60, 90))
TEXTS = ("first", "then", "compare them")


async def e_pd_answer(model_dir: Path, engine: Engine) -> list[int]:
    """Start the services around ``engine`` (left running: its owner closes it), ask the chat
    of ``IMAGES`` and ``TEXTS``, stop the services; the answer's tokens."""
    model_id = engine.model_id
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    encoder = await build_encode_server(
        EncodeConfig(model_dir, model_id=model_id, scheduler=endpoint, worker_id="enc0")
    )
    prefill = await build_prefill_server(PrefillConfig(model_dir, scheduler=endpoint), engine)
    route = await build_route_server(RouteConfig(model_dir, endpoint, model_id))
    try:
        async with create_channel(endpoint) as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            for _ in range(200):
                listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest())
                if len(listing.workers) == 2:
                    break
                await asyncio.sleep(0.05)
        async with create_channel(f"127.0.0.1:{route.port}") as channel:
            answers = route_service_pb2_grpc.RouteServiceStub(channel).Generate(
                chat_request(model_id)
            )
            tokens = [t async for r in answers for t in r.token_ids]
        assert encoder.worker.plane.held() == []
        return tokens
    finally:
        await route.stop()
        await prefill.stop()
        await encoder.stop()
        await scheduler.drain_and_stop(0)


def chat_request(model_id: str) -> route_service_pb2.GenerateRequest:
    """``TEXTS[0]``, ``IMAGES[0]``, ``TEXTS[1]``, ``IMAGES[1]``, ``TEXTS[2]``, greedy."""
    first, then, last = TEXTS
    parts = [
        route_service_pb2.ContentPart(text=first),
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(IMAGES[0]))),
        route_service_pb2.ContentPart(text=then),
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(IMAGES[1]))),
        route_service_pb2.ContentPart(text=last),
    ]
    return route_service_pb2.GenerateRequest(
        request_id="families-1",
        model=model_id,
        messages=[route_service_pb2.ChatMessage(role="user", content=parts)],
        sampling=generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True),
    )


def reference_answer(model_dir: Path) -> list[int]:
    """transformers' generate on the same chat."""
    first, then, last = TEXTS
    content = [
        {"type": "text", "text": first},
        {"type": "image"},
        {"type": "text", "text": then},
        {"type": "image"},
        {"type": "text", "text": last},
    ]
    expected = ReferenceEngine(model_dir).generate(
        [{"role": "user", "content": content}],
        list(IMAGES),
        max_tokens=NUM_TOKENS,
        ignore_eos=True,
    )
    return list(expected.token_ids)
