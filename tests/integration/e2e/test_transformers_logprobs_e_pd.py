"""E/PD in one process over real gRPC, its prefill_decode worker on the vLLM engine and then on
the transformers engine: the route's answers with log probabilities are the same on both, the
OpenAI door's JSON (chat with an image, top_logprobs and prompt_logprobs; logprob_token_ids; a
completion's echo; n choices) and the gRPC stream's TokenLogprobs, logprobs within the compat
suite's tolerance."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epd.common.channels import create_channel
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.engine.base import Engine
from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from tests.integration.registered import until_registered
from tests.pictures import picture, png

pytestmark = pytest.mark.vllm
# What differs between two answers to one request whichever engine gives them.
UNIQUE_KEYS = {"id", "created"}
IMAGE = picture(21, 96, 64)
IMAGE_URL = "data:image/png;base64," + base64.b64encode(png(IMAGE)).decode()
GREEDY = {"model": "tiny", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
CHAT = [
    {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
            {"type": "text", "text": "what is in the picture?"},
        ],
    }
]
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "image top_logprobs prompt_logprobs": (
        "chat/completions",
        {**GREEDY, "messages": CHAT, "logprobs": True, "top_logprobs": 3, "prompt_logprobs": 2},
    ),
    "logprob_token_ids": (
        "chat/completions",
        {
            **GREEDY,
            "messages": [{"role": "user", "content": "say something"}],
            "logprobs": True,
            "logprob_token_ids": [60, 61, 5],
        },
    ),
    # NOTE: vLLM takes n > 1 sampled only; min_p 1 leaves one token to draw
    "n choices": (
        "chat/completions",
        {
            **GREEDY,
            "messages": CHAT,
            "n": 2,
            "temperature": 1.0,
            "seed": 5,
            "min_p": 1.0,
            "logprobs": True,
            "top_logprobs": 1,
        },
    ),
    "completion echo": (
        "completions",
        {**GREEDY, "prompt": "the weather today", "echo": True, "logprobs": 2},
    ),
}


class Deployment:
    """A scheduler, an encoder and a route (gRPC and HTTP) of the tiny model, waiting for a
    prefill_decode worker."""

    def __init__(self, endpoint: str, route: Any) -> None:
        self.endpoint = endpoint
        self.url = f"http://127.0.0.1:{route.http.port}/v1/"
        self.grpc = f"127.0.0.1:{route.port}"

    @contextlib.asynccontextmanager
    async def serving(self, model_dir: Any, engine: Engine) -> AsyncIterator[None]:
        """A prefill_decode worker on ``engine``, registered, for the time of the block."""
        prefill = await build_prefill_server(
            PrefillConfig(model_dir, scheduler=self.endpoint), engine
        )
        try:
            await until_registered(self.endpoint, 2)
            yield
        finally:
            await prefill.stop()
            await until_registered(self.endpoint, 1)


@pytest.fixture(scope="module")
async def deployment(tiny_model_dir) -> AsyncIterator[Deployment]:
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    encoder = await build_encode_server(
        EncodeConfig(tiny_model_dir, model_id="tiny", scheduler=endpoint, worker_id="enc0")
    )
    route = await build_route_server(RouteConfig(tiny_model_dir, endpoint, "tiny", http_port=0))
    await until_registered(endpoint, 1)
    yield Deployment(endpoint, route)
    await route.stop()
    await encoder.stop()
    await scheduler.drain_and_stop(0)


async def answers(deployment: Deployment) -> dict[str, Any]:
    """Each of ``BODIES``' answers, and the gRPC stream of a chat with an image."""
    results: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        for name, (path, body) in BODIES.items():
            async with session.post(deployment.url + path, json=body) as response:
                results[name] = (response.status, await response.json())
    async with create_channel(deployment.grpc) as channel:
        stub = route_service_pb2_grpc.RouteServiceStub(channel)
        results["grpc"] = [r async for r in stub.Generate(grpc_request())]
    return results


def grpc_request() -> route_service_pb2.GenerateRequest:
    content = [
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(IMAGE))),
        route_service_pb2.ContentPart(text="describe it"),
    ]
    sampling = generation_pb2.SamplingParams(
        max_tokens=6, ignore_eos=True, logprobs=4, prompt_logprobs=1
    )
    return route_service_pb2.GenerateRequest(
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=content)],
        sampling=sampling,
    )


def assert_same(got: Any, expected: Any, where: str = "") -> None:
    """Equal JSON but for ``UNIQUE_KEYS``, floats within 1e-3."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), where
        for key in expected.keys() - UNIQUE_KEYS:
            assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert type(got) is type(expected) and len(got) == len(expected), where
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, abs=1e-3), where
    else:
        assert got == expected, where


def stream_logprobs(responses: list[route_service_pb2.GenerateResponse]) -> list[list]:
    return [
        [[c.token_id, c.logprob, c.rank, c.token] for c in position.candidates]
        for r in responses
        for position in [*r.prompt_logprobs, *r.logprobs]
    ]


async def test_answers_with_log_probabilities_are_the_vllm_engines(
    deployment, engines, tiny_model_dir
) -> None:
    async with deployment.serving(tiny_model_dir, engines[0]):
        expected = await answers(deployment)
    transformers = await TransformersEngine.start(tiny_model_dir, model_id="tiny")
    try:
        async with deployment.serving(tiny_model_dir, transformers):
            got = await answers(deployment)
    finally:
        await transformers.close()
    for name in BODIES:
        assert expected[name][0] == 200, (name, expected[name])
        assert_same(got[name], expected[name], name)
    chat = got["image top_logprobs prompt_logprobs"][1]
    assert len(chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 20, "expanded"
    first, second = got["n choices"][1]["choices"]
    assert first["logprobs"] == second["logprobs"], "one token to draw at each position"
    assert_same(stream_logprobs(got["grpc"]), stream_logprobs(expected["grpc"]), "grpc")
    assert len(stream_logprobs(got["grpc"])) > 6
