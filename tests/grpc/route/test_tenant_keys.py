"""Per-tenant cache keys: the route salts a request's mm_hashes, block hashes and vLLM
cache_salt by its caller (the bearer token's identity) and its cache_salt, so one tenant's
request never hits another's cached entries; without a token or cache_salt the keys are
today's. Over the route's two doors with in-memory fakes behind them."""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from PIL import Image

from epd.common.auth import bearer_metadata, token_identity
from epd.common.server import ServerOptions, ServiceBinding, build_server
from epd.server.media.hashing import is_mm_hash, key_salt, salted
from epd.server.route import openai_schema as schema
from epd.server.route.app import SERVICE_NAME
from epd.server.route.http_guard import HttpOptions
from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ChatRequest, ImageSource
from epd.server.route.router import Router
from epd.server.route.servicer import RouteServicer
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, model_router

OPERATOR, ALICE, BOB = "operator-token", "alice-token", "bob-token"


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 40, 90)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = png_bytes()
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
# long enough for full blocks before the image and after it
QUESTION = "describe this picture in detail, every object and colour " * 3


@dataclass
class Seen:
    """What one request sent downstream: its image's mm_hash (to the encoder), its block
    hashes (to the scheduler) and its sampling's cache_salt (to the engine)."""

    mm_hash: str
    block_hashes: list[int]
    cache_salt: str


def last_seen(peers: FakePeers) -> Seen:
    place = [request for name, request in peers.scheduler.calls if name == "Place"][-1]
    encoded = peers.encoders["enc0"].requests[-1]
    engine = peers.engines["pd0"].calls[-1][1]
    return Seen(encoded.items[0].mm_hash, list(place.block_hashes), engine.sampling.cache_salt)


@dataclass
class Route:
    """A route with --auth-token OPERATOR and the tenant tokens ALICE and BOB on its HTTP
    port, over fakes."""

    http_url: str
    grpc_endpoint: str
    peers: FakePeers

    async def over_http(self, token: str, **fields: Any) -> Seen:
        content = [{"type": "image_url", "image_url": {"url": PNG_URL}}]
        content.append({"type": "text", "text": QUESTION})
        body = {"model": "tiny", "messages": [{"role": "user", "content": content}], **fields}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                self.http_url + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            ) as response,
        ):
            assert response.status == 200, await response.text()
        return last_seen(self.peers)

    async def over_grpc(self, token: str, cache_salt: str = "") -> Seen:
        parts = [
            route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=PNG)),
            route_service_pb2.ContentPart(text=QUESTION),
        ]
        request = route_service_pb2.GenerateRequest(
            model="tiny",
            messages=[route_service_pb2.ChatMessage(role="user", content=parts)],
            sampling=generation_pb2.SamplingParams(max_tokens=2, cache_salt=cache_salt),
        )
        async with grpc.aio.insecure_channel(self.grpc_endpoint) as channel:
            stub = route_service_pb2_grpc.RouteServiceStub(channel)
            metadata = (bearer_metadata(token),)
            async for _ in stub.Generate(request, timeout=20, metadata=metadata):
                pass
        return last_seen(self.peers)


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(tiny_model_dir)


def fake_peers() -> FakePeers:
    peers = FakePeers(FakeScheduler(encoders=["enc0"]))
    peers.engines["pd0"] = FakeEngine(tokens=[11, 12])
    return peers


@pytest.fixture
async def route(
    prompts: PromptBuilder, tiny_model_dir: Path, tmp_path: Path
) -> AsyncIterator[Route]:
    peers = fake_peers()
    router = model_router(peers, prompts, tiny_model_dir)
    binding = ServiceBinding(
        SERVICE_NAME,
        RouteServicer(router, has_tenants=True),
        route_service_pb2_grpc.add_RouteServiceServicer_to_server,
    )
    server, port = await build_server([binding], ServerOptions(auth_token=OPERATOR))
    await server.mark_serving()
    tokens_file = tmp_path / "tenants"
    tokens_file.write_text(f"# tenants\n{ALICE}\n\n{BOB}\n")
    options = HttpOptions(auth_token=OPERATOR, tenant_tokens_file=str(tokens_file))
    limits = schema.RequestLimits(max_context_tokens=prompts.max_context_tokens)
    http = OpenAiHttp(router, options, limits)
    http_port = await http.start("127.0.0.1", 0)
    yield Route(f"http://127.0.0.1:{http_port}", f"127.0.0.1:{port}", peers)
    await http.stop()
    await server.drain_and_stop(0)


def assert_apart(one: Seen, other: Seen) -> None:
    """No key of ``one`` can hit an entry ``other`` made: another mm_hash, no block hash in
    common, another cache_salt for vLLM."""
    assert is_mm_hash(one.mm_hash) and is_mm_hash(other.mm_hash)
    assert one.mm_hash != other.mm_hash
    assert len(one.block_hashes) == len(other.block_hashes) >= 4
    assert not set(one.block_hashes) & set(other.block_hashes)
    assert other.cache_salt and one.cache_salt != other.cache_salt


async def test_two_tokens_share_no_key_and_one_token_hits_its_own(route: Route) -> None:
    alice = await route.over_http(ALICE, max_tokens=2)
    bob = await route.over_http(BOB, max_tokens=2)
    assert_apart(alice, bob)
    assert await route.over_http(ALICE, max_tokens=2) == alice
    assert alice.cache_salt == key_salt(token_identity(ALICE), "")


async def test_a_tenant_token_is_the_http_ports_only(route: Route) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            route.http_url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": "Bearer carol-token"},
        ) as response,
    ):
        assert response.status == 401
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await route.over_grpc(ALICE)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_grpc_door_keys_by_its_token_and_a_cache_salt_apart(route: Route) -> None:
    operator = await route.over_grpc(OPERATOR)
    assert operator.cache_salt == key_salt(token_identity(OPERATOR), "")
    assert_apart(operator, await route.over_grpc(OPERATOR, cache_salt="project-7"))
    assert await route.over_grpc(OPERATOR) == operator
    assert_apart(operator, await route.over_http(ALICE, max_tokens=2))


def chat(cache_salt: str = "") -> ChatRequest:
    parts = [ChatPart(image=ImageSource(data=PNG)), ChatPart(text=QUESTION)]
    sampling = generation_pb2.SamplingParams(max_tokens=2, cache_salt=cache_salt)
    return ChatRequest("r", "tiny", [ChatMessage("user", parts)], sampling)


async def answer(router: Router, request: ChatRequest) -> None:
    async for _ in router.generate(request, timeout_s=20):
        pass


async def test_without_auth_or_cache_salt_the_keys_are_todays(
    prompts: PromptBuilder, tiny_model_dir: Path
) -> None:
    peers = fake_peers()
    router = model_router(peers, prompts, tiny_model_dir)
    await answer(router, chat())
    shared = last_seen(peers)
    loaded = await router.loader.load(data=PNG)
    assert shared.mm_hash == loaded.mm_hash
    assert shared.cache_salt == ""
    token_ids = peers.engines["pd0"].calls[-1][1].prompt.token_ids
    num_tokens = router.grids.num_tokens(router.grids.grid_of_size(64, 48))
    expected = prompts.block_hashes(list(token_ids), [(loaded.mm_hash, num_tokens)])
    assert shared.block_hashes == expected
    await answer(router, chat(cache_salt="team-a"))
    salted_once = last_seen(peers)
    assert_apart(shared, salted_once)
    assert salted_once.mm_hash == salted(loaded.mm_hash, key_salt("", "team-a"))
    await answer(router, chat(cache_salt="team-a"))
    assert last_seen(peers) == salted_once
