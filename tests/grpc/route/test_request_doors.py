"""One request, two doors: the same chat sent to the route's OpenAI HTTP port and to its gRPC
``RouteService.Generate`` is judged the same way (accepted by both, or refused by both with the
same reason naming the same field), over one Router with in-memory fakes behind it."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from PIL import Image

from epd.client import EpdClientError
from epd.common.server import ServiceBinding, build_server
from epd.launch.free_ports import free_port
from epd.server.route import openai_schema as schema
from epd.server.route.app import SERVICE_NAME, RouteConfig, build_route_server
from epd.server.route.http_guard import HttpOptions
from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.prompt import PromptBuilder
from epd.server.route.servicer import RouteServicer
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, model_router

Outcome = tuple[str, str]  # ("ok", "") or (reason, param)
OK: Outcome = ("ok", "")
CONTEXT = 4096  # the tiny model's max_position_embeddings


@dataclass
class Doors:
    """A route's two doors over one router, and the fakes behind it."""

    http_url: str
    grpc_endpoint: str
    peers: FakePeers

    async def over_http(self, body: Any, headers: dict[str, str] | None = None) -> Outcome:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                self.http_url + "/v1/chat/completions",
                data=io.BytesIO(json.dumps(body).encode()),
                headers={"Content-Type": "application/json", **(headers or {})},
            ) as response,
        ):
            answer = await response.json(content_type=None)
        if response.status == 200:
            return OK
        assert response.status == 400, answer
        return answer["error"]["code"], answer["error"]["param"] or ""

    async def over_grpc(self, request: route_service_pb2.GenerateRequest) -> Outcome:
        async with grpc.aio.insecure_channel(self.grpc_endpoint) as channel:
            stub = route_service_pb2_grpc.RouteServiceStub(channel)
            try:
                async for _ in stub.Generate(request, timeout=20):
                    pass
            except grpc.aio.AioRpcError as e:
                error = EpdClientError.from_rpc_error(e)
                assert error.code == "INVALID_ARGUMENT", error
                return error.reason, error.metadata.get("param", "")
        return OK


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(tiny_model_dir)


@pytest.fixture
async def doors(prompts: PromptBuilder, tiny_model_dir: Path) -> AsyncIterator[Doors]:
    """Both doors as ``build_route_server`` makes them, the gRPC one with its default limits."""
    peers = FakePeers(FakeScheduler(encoders=["enc0"]))
    peers.engines["pd0"] = FakeEngine(tokens=[11, 12, 13])
    router = model_router(peers, prompts, tiny_model_dir)
    binding = ServiceBinding(
        SERVICE_NAME,
        RouteServicer(router),
        route_service_pb2_grpc.add_RouteServiceServicer_to_server,
    )
    server, port = await build_server([binding])
    await server.mark_serving()
    limits = schema.RequestLimits(max_context_tokens=prompts.max_context_tokens)
    http = OpenAiHttp(router, HttpOptions(), limits)
    http_port = await http.start("127.0.0.1", 0)
    yield Doors(f"http://127.0.0.1:{http_port}", f"127.0.0.1:{port}", peers)
    await http.stop()
    await server.drain_and_stop(0)


def png_bytes(width: int = 32, height: int = 24) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (20, 120, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = png_bytes()
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()

# --- The same request for each door ------------------------------------------------------------
# A message is (role, parts); a part is text, an image (its http body's url, its MediaItem), or
# None: the part the HTTP body cannot express otherwise than with a type that is neither.

Part = str | tuple[str, multimodal_pb2.MediaItem] | None
Message = tuple[str, list[Part]]


def image(url: str, media: multimodal_pb2.MediaItem | None = None) -> Part:
    return url, media or multimodal_pb2.MediaItem(url=url)


def body_of(messages: list[Message], sampling: dict[str, Any]) -> dict[str, Any]:
    def part(value: Part) -> dict[str, Any]:
        if value is None:
            return {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
        if isinstance(value, str):
            return {"type": "text", "text": value}
        return {"type": "image_url", "image_url": {"url": value[0]}}

    chat = [{"role": role, "content": [part(p) for p in parts]} for role, parts in messages]
    return {"model": "tiny", "messages": chat, **sampling}


def request_of(
    messages: list[Message], sampling: dict[str, Any]
) -> route_service_pb2.GenerateRequest:
    def part(value: Part) -> route_service_pb2.ContentPart:
        if value is None:
            return route_service_pb2.ContentPart()
        if isinstance(value, str):
            return route_service_pb2.ContentPart(text=value)
        return route_service_pb2.ContentPart(image=value[1])

    chat = [
        route_service_pb2.ChatMessage(role=role, content=[part(p) for p in parts])
        for role, parts in messages
    ]
    fields = {name: value for name, value in sampling.items() if name != "model"}
    return route_service_pb2.GenerateRequest(
        model=sampling.get("model", "tiny"),
        messages=chat,
        sampling=generation_pb2.SamplingParams(**fields),
    )


HI: list[Message] = [("user", ["hi"])]
# (name, messages, model and sampling parameters, the judgement both doors must give)
CORPUS: list[tuple[str, list[Message], dict[str, Any], Outcome]] = [
    ("plain", HI, {"max_tokens": 3}, OK),
    ("max_tokens is the context", HI, {"max_tokens": CONTEXT}, OK),
    (
        "a part with neither text nor image",
        [("user", [None])],
        {},
        ("BAD_REQUEST", "messages[0].content[0]"),
    ),
    (
        "upper-case data URL",
        [
            (
                "user",
                [image(PNG_URL.replace("data:image/png;base64", "DATA:IMAGE/PNG;BASE64")), "what?"],
            )
        ],
        {},
        OK,
    ),
    ("developer role", [("developer", ["be brief"]), ("user", ["hi"])], {}, OK),
    ("unknown role", [("function", ["42"])], {}, ("BAD_ROLE", "messages[0].role")),
    ("no messages", [], {}, ("EMPTY_CHAT", "messages")),
    ("a message without parts", [("user", [])], {}, ("EMPTY_MESSAGE", "messages[0].content")),
    ("temperature above 2", HI, {"temperature": 2.5}, ("BAD_REQUEST", "temperature")),
    ("temperature NaN", HI, {"temperature": float("nan")}, ("BAD_REQUEST", "temperature")),
    ("top_p above 1", HI, {"top_p": 1.5}, ("BAD_REQUEST", "top_p")),
    ("top_k beyond int32", HI, {"top_k": 2**31}, ("BAD_REQUEST", "top_k")),
    ("five stop strings", HI, {"stop": ["a", "b", "c", "d", "e"]}, ("BAD_REQUEST", "stop")),
    ("a long stop string", HI, {"stop": ["s" * 1025]}, ("BAD_REQUEST", "stop[0]")),
    (
        "too many stop token ids",
        HI,
        {"stop_token_ids": list(range(1025))},
        ("BAD_REQUEST", "stop_token_ids"),
    ),
    ("too many images", [("user", [image(PNG_URL)] * 17)], {}, ("LIMIT_EXCEEDED", "messages")),
    ("too many parts", [("user", ["x"] * 257)], {}, ("LIMIT_EXCEEDED", "messages[0].content")),
    ("too many messages", [("user", ["x"])] * 2049, {}, ("LIMIT_EXCEEDED", "messages")),
    ("too much text", [("user", ["x" * (1 << 20), "y"])], {}, ("LIMIT_EXCEEDED", "messages")),
    (
        "an image without a source",
        [("user", [image("")])],
        {},
        ("BAD_MEDIA_ITEM", "messages[0].content[0].image"),
    ),
    (
        "an upper-case private URL",
        [("user", [image("HTTP://127.0.0.1:9/x.png")])],
        {},
        ("PRIVATE_ADDRESS", ""),
    ),
    ("a long model name", HI, {"model": "m" * 300}, ("BAD_REQUEST", "model")),
]


@pytest.mark.parametrize(
    ("messages", "sampling", "expected"),
    [case[1:] for case in CORPUS],
    ids=[case[0] for case in CORPUS],
)
async def test_both_doors_judge_a_request_alike(
    doors: Doors, messages: list[Message], sampling: dict[str, Any], expected: Outcome
) -> None:
    over_http = await doors.over_http(body_of(messages, sampling))
    over_grpc = await doors.over_grpc(request_of(messages, sampling))
    assert (over_http, over_grpc) == (expected, expected)
    if expected != OK:
        assert doors.peers.engines["pd0"].calls == []


async def test_max_tokens_beyond_the_context_is_refused_by_grpc_and_the_context_over_http(
    doors: Doors,
) -> None:
    """Over gRPC a huge max_tokens used to generate until the end of the context (18 s); over
    HTTP it is the rest of the context, as vLLM's OpenAI server makes it."""
    assert await doors.over_http(body_of(HI, {"max_tokens": 10**9})) == OK
    assert doors.peers.engines["pd0"].calls[0][1].sampling.max_tokens == CONTEXT
    async with grpc.aio.insecure_channel(doors.grpc_endpoint) as channel:
        stub = route_service_pb2_grpc.RouteServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.Generate(request_of(HI, {"max_tokens": 10**9}), timeout=20):
                pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"max_tokens is {10**9} but the model's context is {CONTEXT} tokens" in str(
        caught.value.details()
    )


async def test_without_max_tokens_both_doors_ask_the_engine_for_the_context(doors: Doors) -> None:
    assert await doors.over_http(body_of(HI, {})) == OK
    assert await doors.over_grpc(request_of(HI, {})) == OK
    asked = [call[1].sampling.max_tokens for call in doors.peers.engines["pd0"].calls]
    assert asked == [CONTEXT, CONTEXT]


async def test_a_malformed_request_id_is_refused_by_both_doors(doors: Doors) -> None:
    request = request_of(HI, {})
    request.request_id = "a b"
    assert await doors.over_grpc(request) == ("BAD_REQUEST", "request_id")
    assert await doors.over_http(body_of(HI, {}), {"X-Request-Id": "a b"}) == (
        "BAD_REQUEST",
        "X-Request-Id",
    )
    assert doors.peers.scheduler.calls == []


def _set_pixels(request: route_service_pb2.GenerateRequest) -> None:
    request.messages[0].content[0].image.pixels.byte_size = 12


def _set_policy(request: route_service_pb2.GenerateRequest) -> None:
    request.encoder_policy = 99  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (_set_pixels, ("BAD_MEDIA_ITEM", "messages[0].content[0].image.pixels")),
        (_set_policy, ("BAD_REQUEST", "encoder_policy")),
    ],
    ids=["pixels", "encoder policy"],
)
async def test_fields_the_http_door_cannot_send_are_checked_over_grpc(
    doors: Doors,
    tamper: Callable[[route_service_pb2.GenerateRequest], None],
    expected: Outcome,
) -> None:
    """Pixels (shared memory the route sets for its encoders) and an encoder policy this
    version does not know are refused before any work."""
    request = request_of([("user", [image(PNG_URL), "what?"])], {})
    tamper(request)
    assert await doors.over_grpc(request) == expected
    assert doors.peers.engines["pd0"].calls == [] and doors.peers.scheduler.calls == []


async def test_a_served_route_gives_both_doors_its_limits_and_context(tiny_model_dir: Path) -> None:
    """``build_route_server`` hands the configured limits and the model's context to the gRPC
    door as to the HTTP one: refused before the (unreachable) scheduler is needed."""
    limits = schema.RequestLimits(max_images=1)
    config = RouteConfig(tiny_model_dir, f"127.0.0.1:{free_port()}", "tiny", http_port=0)
    config.limits = limits
    app = await build_route_server(config)
    try:
        assert app.http is not None
        doors = Doors(f"http://127.0.0.1:{app.http.port}", f"127.0.0.1:{app.port}", FakePeers())
        messages = [("user", [image(PNG_URL)] * 2)]
        expected = ("LIMIT_EXCEEDED", "messages")
        assert await doors.over_http(body_of(messages, {})) == expected
        assert await doors.over_grpc(request_of(messages, {})) == expected
        too_long = request_of(HI, {"max_tokens": 10**9})
        assert await doors.over_grpc(too_long) == ("BAD_REQUEST", "max_tokens")
    finally:
        await app.stop()


async def test_a_draining_route_reports_unready_over_http_and_refuses_new_requests(
    tiny_model_dir: Path,
) -> None:
    """HTTP probes (a TLS route's readiness) see the drain that gRPC's health reports: /health
    turns 503 and new requests get 503 DRAINING, while the port stays up for streams under way."""
    config = RouteConfig(tiny_model_dir, f"127.0.0.1:{free_port()}", "tiny", http_port=0)
    app = await build_route_server(config)
    try:
        assert app.http is not None
        url = f"http://127.0.0.1:{app.http.port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/health") as response:
                assert response.status == 200
            await app.server.drain_and_stop(0)
            async with session.get(url + "/health") as response:
                assert response.status == 503
            async with session.post(url + "/v1/chat/completions", json=body_of(HI, {})) as reply:
                answer = await reply.json()
                assert (reply.status, answer["error"]["code"]) == (503, "DRAINING")
    finally:
        await app.stop()


async def test_without_vllm_the_route_refuses_the_openai_port_and_serves_grpc(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM is an optional extra: its request models parse OpenAI bodies, so a route without it
    refuses --http-port with a clear error, and gRPC requests are judged by the engines."""
    from epd.server.route import app as route_app
    from epd.server.route import sampling

    monkeypatch.setattr(route_app, "IS_VLLM_INSTALLED", False)
    monkeypatch.setattr(sampling, "IS_VLLM_INSTALLED", False)
    config = RouteConfig(tiny_model_dir, f"127.0.0.1:{free_port()}", "tiny", http_port=0)
    with pytest.raises(ValueError, match="install vLLM"):
        await build_route_server(config)
    sampling.check_sampling(generation_pb2.SamplingParams(temperature=-5))
