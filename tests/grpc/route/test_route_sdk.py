"""The real RouteService (servicer, router, prompt, media rules) over gRPC with in-memory fakes
behind it, driven by the SDK: streaming, typed errors, auth, cancellation releasing leases."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from PIL import Image

from epd.client import AsyncEpdClient, EpdClient, InvalidRequest, Unauthenticated, Unavailable, user
from epd.common.errors import InvalidArgument as InvalidArgumentError
from epd.common.errors import Unavailable as ServerUnavailable
from epd.common.roles import Role
from epd.common.server import ServerOptions
from epd.server.route.prompt import PromptBuilder
from tests.unit.route.fake_encoder import FakeEncoder
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_route import serve_route
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers

TOKEN = "s3cret"
Route = tuple[str, FakePeers, PromptBuilder]


def png(width: int = 64, height: int = 48) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
async def route(tiny_model_dir: Path) -> AsyncIterator[Route]:
    """A route over fakes."""
    peers = FakePeers(FakeScheduler(encoders=["enc0", "enc1"]))
    served = await serve_route(
        tiny_model_dir, peers, "a red square", ServerOptions(auth_token=TOKEN)
    )
    yield f"127.0.0.1:{served.port}", peers, served.prompts
    await served.server.drain_and_stop(0)


async def test_async_stream_delivers_text_tokens_and_usage(route) -> None:
    endpoint, peers, prompts = route
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        chunks = [
            c
            async for c in client.stream(
                [user("what?", images=[png(), png(30, 90)])], max_tokens=5, request_id="r1"
            )
        ]
    assert "".join(c.text for c in chunks) == "a red square"
    assert chunks[-1].finish_reason == "length" and chunks[-1].request_id == "r1"
    (prefill,) = peers.engines["pd0"].calls
    images = prefill[1].prompt.images
    assert len(images) == 2 and all(image.mm_hash and image.HasField("grid") for image in images)
    sources = {image.WhichOneof("source") for image in images}
    assert sources == {"embeddings"}
    assert list(prefill[1].prompt.token_ids).count(prompts.image_pad_id) == 2
    released = [lease for e in peers.encoders.values() for lease in e.released]
    assert len(released) == 2


async def test_sync_client_generate_and_typed_errors(route) -> None:
    endpoint, _, _ = route
    # NOTE: the blocking client runs in a thread; the server shares this test's event loop.
    await asyncio.to_thread(_sync_calls, endpoint)


def _sync_calls(endpoint: str) -> None:
    with EpdClient(endpoint, auth_token=TOKEN) as client:
        answer = client.generate([user("what?", image=png())])
        assert answer.text == "a red square"
        assert answer.usage.completion_tokens == len(answer.token_ids)
        with pytest.raises(InvalidRequest) as caught:
            client.generate([user("what?", image=b"not an image")])
        assert caught.value.code == "INVALID_ARGUMENT" and caught.value.reason == "BAD_IMAGE"
    with EpdClient(endpoint, auth_token="wrong") as client, pytest.raises(Unauthenticated):
        client.generate([user("hi")])


async def test_the_prefill_worker_is_placed_with_the_encoders_before_they_encode(route) -> None:
    endpoint, peers, _ = route
    for name in ("enc0", "enc1"):
        peers.encoders[name] = FakeEncoder(name, hold=peers.scheduler.prefill_chosen)
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        answer = await asyncio.wait_for(client.generate([user("hi", image=png())]), 10)
    assert answer.text == "a red square"
    names = [name for name, _ in peers.scheduler.calls]
    assert names.index("ChoosePrefill") < names.index("CompleteEncoding")


async def test_images_left_unplaced_are_encoded_before_the_prompt_is_sent(route) -> None:
    endpoint, peers, _ = route
    assign = peers.scheduler.AssignEncoders

    async def place_only_the_first(request, timeout=None):  # type: ignore[no-untyped-def]
        reply = await assign(request, timeout)
        del reply.assignments[1:]
        return reply

    peers.scheduler.AssignEncoders = place_only_the_first  # type: ignore[method-assign]
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        answer = await asyncio.wait_for(
            client.generate([user("hi", images=[png(), png(30, 90)])]), 10
        )
    assert answer.text == "a red square"
    (prefill,) = peers.engines["pd0"].calls
    assert [image.WhichOneof("source") for image in prefill[1].prompt.images] == [
        "embeddings",
        "embeddings",
    ]


async def test_a_bad_image_fails_the_request_before_the_engine_is_called(route) -> None:
    endpoint, peers, _ = route
    peers.encoders["enc0"] = FakeEncoder("enc0", InvalidArgumentError("bad", reason="BAD_IMAGE"))
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        with pytest.raises(InvalidRequest) as caught:
            await asyncio.wait_for(client.generate([user("hi", image=png())]), 10)
    assert caught.value.reason == "BAD_IMAGE"
    assert peers.engines["pd0"].calls == []


async def test_no_prefill_worker_is_unavailable_with_a_reason(route) -> None:
    endpoint, peers, _ = route
    peers.scheduler.prefills.clear()
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        with pytest.raises(Unavailable) as caught:
            await client.generate([user("hi", image=png())])
    assert caught.value.reason == "NO_WORKER"
    released = [lease for e in peers.encoders.values() for lease in e.released]
    handed_out = sum(s.num_yielded for e in peers.encoders.values() for s in e.streams)
    assert len(released) == handed_out


async def test_an_engine_dying_before_the_first_token_is_retried(route) -> None:
    endpoint, peers, _ = route
    peers.scheduler.prefills.insert(0, ("pd-dead", Role.PREFILL_DECODE))
    peers.engines["pd-dead"] = FakeEngine(error=ServerUnavailable("down"))
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        answer = await client.generate([user("hi")])
    assert answer.text == "a red square"


async def test_client_cancellation_cancels_the_engine_stream_and_releases(route) -> None:
    endpoint, peers, _ = route
    engine = peers.engines["pd0"]
    engine.tokens = engine.tokens * 200
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        stream = client.stream([user("hi", image=png())])
        await anext(stream)
        await stream.aclose()
        for _ in range(100):
            if engine.streams and engine.streams[-1].is_cancelled:
                break
            await asyncio.sleep(0.02)
    assert engine.streams[-1].is_cancelled
    assert len([lease for e in peers.encoders.values() for lease in e.released]) == 1


async def test_an_unknown_model_is_not_found_and_names_the_served_models(route) -> None:
    endpoint, peers, _ = route
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        with pytest.raises(InvalidRequest) as caught:
            await client.generate([user("hi", image=png())], model="x")
    assert (caught.value.code, caught.value.reason) == ("NOT_FOUND", "MODEL_NOT_FOUND")
    assert "model 'x' is not served here; served models: tiny" in str(caught.value)
    assert [name for name, _ in peers.scheduler.calls] == ["ListWorkers"]


async def test_list_models_with_the_scheduler_down_is_unavailable(route) -> None:
    endpoint, peers, _ = route

    async def scheduler_down(request, timeout=None):  # type: ignore[no-untyped-def]
        raise ServerUnavailable("scheduler down", reason="SCHEDULER_DOWN")

    peers.scheduler.ListWorkers = scheduler_down  # type: ignore[method-assign]
    async with AsyncEpdClient(endpoint, auth_token=TOKEN) as client:
        with pytest.raises(Unavailable) as caught:
            await client.list_models()
    assert caught.value.reason == "SCHEDULER_DOWN"
