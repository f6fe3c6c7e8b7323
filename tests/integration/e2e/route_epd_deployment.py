"""Route -> Scheduler -> two encoders -> Prefill(+decode) in one process over real gRPC, on the
session's vLLM producer; the requests sent to its doors and the counts of the media loader's
work."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import pytest
from PIL import Image

from epd.common.channels import create_channel
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from tests.integration.registered import until_registered
from tests.pictures import data_url, png


def deployment_fixture(scope: Literal["module", "package"]) -> Any:
    """A fixture of the deployment at ``scope``: (the route's gRPC stub, the encoders' servers,
    the route's server, the prefill server), stopped after the scope's last test."""

    @pytest.fixture(scope=scope)
    async def deployment(tiny_model_dir, engines):
        """The services around the session's vLLM producer (which serves whole generations too)."""
        scheduler, scheduler_port = await build_scheduler_server()
        endpoint = f"127.0.0.1:{scheduler_port}"
        encoders = [
            await build_encode_server(
                EncodeConfig(
                    tiny_model_dir, model_id="tiny", scheduler=endpoint, worker_id=f"enc{i}"
                )
            )
            for i in range(2)
        ]
        engine = engines[0]
        prefill = await build_prefill_server(
            PrefillConfig(tiny_model_dir, scheduler=endpoint), engine
        )
        route = await build_route_server(RouteConfig(tiny_model_dir, endpoint, "tiny", http_port=0))
        await until_registered(endpoint, 3)
        channel = create_channel(f"127.0.0.1:{route.port}")
        yield route_service_pb2_grpc.RouteServiceStub(channel), encoders, route, prefill
        await channel.close()
        await route.stop()
        await prefill.stop()
        for encoder in encoders:
            await encoder.stop()
        await scheduler.drain_and_stop(0)

    return deployment


def chat_request(
    images: list[Image.Image], text: str, **sampling
) -> route_service_pb2.GenerateRequest:
    content = [
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(image)))
        for image in images
    ]
    content.append(route_service_pb2.ContentPart(text=text))
    return route_service_pb2.GenerateRequest(
        request_id="req-1",
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=content)],
        sampling=generation_pb2.SamplingParams(**sampling),
    )


def openai_messages(images: list[Image.Image], text: str) -> list[dict[str, object]]:
    parts: list[dict[str, object]] = [
        {"type": "image_url", "image_url": {"url": data_url(i)}} for i in images
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def counted(counts: Counter[str], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, counting its calls in ``counts[name]``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return function(*args, **kwargs)

    return call


def count_decodes_and_hashes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of the media loader's image decodes ("decode") and hash walks ("hash") in this
    process (every service of the in-process deployments), from now on."""
    from epd.server.media import loader

    counts: Counter[str] = Counter()
    monkeypatch.setattr(loader, "decode_image", counted(counts, "decode", loader.decode_image))
    monkeypatch.setattr(loader, "mm_hash", counted(counts, "hash", loader.mm_hash))
    return counts
