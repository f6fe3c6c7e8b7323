"""Multimodal prefix routing, route and scheduler together: the real Router (chat template,
image hashing, block hashes of the expanded prompt) places each turn of an image chat with the
real scheduler over gRPC, which has two prefill+decode workers registered; the engines and the
encoder are in-memory fakes that record which worker got each turn."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from epd.common.channels import create_channel
from epd.common.clients import SchedulerClient
from epd.scheduler.app import build_scheduler_server
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ChatRequest, ImageSource
from epd.server.route.router import Router
from epd.v1 import generation_pb2
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fakes import FakePeers, model_router

WORKERS = ("pd0", "pd1")
QUESTIONS = (
    "what is in this picture? describe every part of it in detail",
    "and what colour is the largest shape in the upper half of it?",
    "could you count the shapes, one by one, from left to right?",
)


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (56, 84, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class PlacingScheduler:
    """The real scheduler's client, keeping each Place answer."""

    client: SchedulerClient
    placed: list[pb.PlaceResponse] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def Place(self, request: Any, timeout: float | None = None) -> pb.PlaceResponse:
        reply = await self.client.Place(request, timeout=timeout)
        self.placed.append(reply)
        return reply


@dataclass
class Deployment:
    router: Router
    scheduler: PlacingScheduler
    stub: pb_grpc.SchedulerServiceStub
    leases: dict[str, str]

    async def ask(self, chat: list[ChatMessage]) -> tuple[str, int]:
        """Answer ``chat``; the worker that prefilled it and the blocks it held already."""
        request = ChatRequest(
            "r", "tiny", chat, generation_pb2.SamplingParams(max_tokens=2, ignore_eos=True)
        )
        async for _ in self.router.generate(request, timeout_s=20):
            pass
        placed = self.scheduler.placed[-1].prefill
        return placed.worker.id, placed.num_cached_blocks

    async def load(self, worker_id: str, queue_depth: int) -> None:
        load = pb.WorkerLoad(queue_depth=queue_depth)
        await self.stub.Heartbeat(pb.HeartbeatRequest(lease_id=self.leases[worker_id], load=load))


@pytest.fixture
async def deployment(tiny_model_dir: Path) -> AsyncIterator[Deployment]:
    server, port = await build_scheduler_server()
    channel = create_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.SchedulerServiceStub(channel)
    roles = [("enc0", pb.WORKER_ROLE_ENCODE)]
    roles += [(worker_id, pb.WORKER_ROLE_PREFILL_DECODE) for worker_id in WORKERS]
    leases = {}
    for port, (worker_id, role) in enumerate(roles, start=7100):
        endpoint = f"127.0.0.1:{port}"
        worker = pb.WorkerInfo(
            id=worker_id, role=role, endpoint=endpoint, model="tiny", weight=1.0, capacity=8
        )
        reply = await stub.RegisterWorker(pb.RegisterWorkerRequest(worker=worker))
        leases[worker_id] = reply.lease_id
    scheduler = PlacingScheduler(SchedulerClient(channel))
    peers = FakePeers(scheduler)  # type: ignore[arg-type]
    for port in range(7101, 7101 + len(WORKERS)):
        peers.engines[f"127.0.0.1:{port}"] = FakeEngine(tokens=[11, 12])
    router = model_router(peers, PromptBuilder(tiny_model_dir), tiny_model_dir)
    yield Deployment(router, scheduler, stub, leases)
    await channel.close()
    await server.drain_and_stop(0)


def num_full_blocks(router: Router, chat: list[ChatMessage]) -> int:
    """Full blocks of ``chat``'s prompt as the engine holds it (its one image expanded)."""
    grids = router.grids
    image = [("", grids.num_tokens(grids.grid_of_size(84, 56)))]
    return len(router.prompts.block_hashes(router.prompts.token_ids(chat), image))


def turns(image: bytes, answer: str) -> list[list[ChatMessage]]:
    """The chat at each turn of a conversation about ``image``: one question per turn, each
    answered ``answer``, the image in the first."""
    chat: list[ChatMessage] = []
    chats = []
    for index, question in enumerate(QUESTIONS):
        parts = [ChatPart(text=question)]
        if index == 0:
            parts.insert(0, ChatPart(image=ImageSource(data=image)))
        chat = [*chat, ChatMessage("user", parts)]
        chats.append(chat)
        chat = [*chat, ChatMessage("assistant", [ChatPart(text=answer)])]
    return chats


async def test_a_conversation_stays_with_the_worker_holding_it(deployment: Deployment) -> None:
    first, second = turns(png(1), "a red square"), turns(png(2), "a red square")
    home, cached = await deployment.ask(first[0])
    assert cached == 0
    other = next(w for w in WORKERS if w != home)
    await deployment.load(home, queue_depth=3)
    # NOTE: a new conversation holds no prefix anywhere: the idle worker gets it
    away, cached = await deployment.ask(second[0])
    assert (away, cached) == (other, 0)
    for chat in first[1:]:
        worker, cached = await deployment.ask(chat)
        assert worker == home, "the busier worker holds the conversation's image and turns"
        assert cached == num_full_blocks(deployment.router, chat[:-2]), "the last turn's"
    worker, cached = await deployment.ask(second[1])
    assert worker == away and cached > 0


async def test_conversations_spread_over_idle_workers_and_stay(deployment: Deployment) -> None:
    first, second = turns(png(3), "x"), turns(png(4), "x")
    home, _ = await deployment.ask(first[0])
    # NOTE: the same question about another image shares the system prompt's block only
    away, cached = await deployment.ask(second[0])
    assert away != home and cached == 0
    assert (await deployment.ask(first[1]))[0] == home
    assert (await deployment.ask(second[1]))[0] == away
