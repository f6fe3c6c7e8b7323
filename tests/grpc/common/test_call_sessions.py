"""Call sessions: many calls over one stream behave exactly like per-call RPCs (results, errors,
cancellation, deadlines, drain, auth), and fall back to per-call RPCs for servers without them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from epd.server.common import errors
from epd.server.common.channels import create_channel
from epd.server.common.clients import EncoderClient, PrefillClient
from epd.server.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.server.common.sessions import SessionDrain, serve_session
from epd.server.common.status import from_rpc_error, handle_errors
from epd.server.prefill import convert
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import generation_pb2, multimodal_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding, errors_under_test


class SessionEncodeService(ScriptedEncodeService):
    """The scripted encoder with EncodeSession (the last item ends a call)."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions = SessionDrain()
        self.num_sessions = 0

    async def EncodeSession(self, frames: Any, context: Any) -> None:
        self.num_sessions += 1
        await serve_session(frames, context, self.Encode, encode_pb.EncodeSessionResponse,
                            self.sessions,
                            final=lambda request, n, _: n == len(request.items))  # fmt: skip


class ScriptedPrefillService(prefill_grpc.PrefillServiceServicer):  # type: ignore[misc]
    """Prefill answers ``max_tokens`` as the first token (or raises ``error``); PrefillDecode
    streams tokens 0..max_tokens-1, ``delay_s`` apart, the last with a finish reason."""

    def __init__(self) -> None:
        self.sessions = SessionDrain()
        self.num_sessions = 0
        self.error: Exception | None = None
        self.delay_s = 0.0
        self.exits: list[str] = []

    @handle_errors
    async def Prefill(self, request: Any, context: Any) -> prefill_pb.PrefillResponse:
        if self.error is not None:
            raise self.error
        await asyncio.sleep(self.delay_s)
        return prefill_pb.PrefillResponse(first_token_id=request.sampling.max_tokens)

    @handle_errors
    async def PrefillDecode(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            count = request.sampling.max_tokens
            for token in range(count):
                await asyncio.sleep(self.delay_s)
                finish = generation_pb2.FINISH_REASON_LENGTH if token == count - 1 else 0
                yield prefill_pb.PrefillDecodeResponse(token_ids=[token], finish_reason=finish)
            self.exits.append("done")
        except BaseException as e:
            self.exits.append(type(e).__name__)
            raise

    async def PrefillSession(self, frames: Any, context: Any) -> None:
        self.num_sessions += 1
        await serve_session(frames, context, self.Prefill, prefill_pb.PrefillSessionResponse,
                            self.sessions)  # fmt: skip

    async def PrefillDecodeSession(self, frames: Any, context: Any) -> None:
        self.num_sessions += 1
        await serve_session(frames, context, self.PrefillDecode,
                            prefill_pb.PrefillDecodeSessionResponse, self.sessions,
                            final=convert.finishes)  # fmt: skip


def prefill_binding(servicer: ScriptedPrefillService) -> ServiceBinding:
    return ServiceBinding("epd.v1.PrefillService", servicer,
                          prefill_grpc.add_PrefillServiceServicer_to_server)  # fmt: skip


async def start(binding: ServiceBinding, **options: Any) -> tuple[EpdServer, str]:
    server, port = await build_server([binding], ServerOptions(**options))
    return server, f"127.0.0.1:{port}"


def decode_request(max_tokens: int, request_id: str = "r") -> prefill_pb.PrefillDecodeRequest:
    return prefill_pb.PrefillDecodeRequest(
        request_id=request_id, sampling=generation_pb2.SamplingParams(max_tokens=max_tokens))


def prefill_request(max_tokens: int) -> prefill_pb.PrefillRequest:
    return prefill_pb.PrefillRequest(
        request_id="r", sampling=generation_pb2.SamplingParams(max_tokens=max_tokens))


def encode_request(*hashes: str) -> encode_pb.EncodeRequest:
    return encode_pb.EncodeRequest(items=[multimodal_pb2.MediaItem(mm_hash=h) for h in hashes])


async def tokens(call: Any) -> list[int]:
    return [token async for response in call for token in response.token_ids]


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.fixture
async def prefill() -> AsyncIterator[tuple[ScriptedPrefillService, EpdServer, grpc.aio.Channel]]:
    servicer = ScriptedPrefillService()
    server, endpoint = await start(prefill_binding(servicer))
    channel = create_channel(endpoint)
    yield servicer, server, channel
    await channel.close()
    await server.drain_and_stop(0)


async def test_concurrent_calls_share_one_stream_and_match_per_call(prefill: Any) -> None:
    servicer, _, channel = prefill
    client = PrefillClient(channel, sessions=True)
    per_call = PrefillClient(channel, sessions=False)
    counts = [1, 5, 3, 8, 2] * 4
    got = await asyncio.gather(*(tokens(client.PrefillDecode(decode_request(n), timeout=5))
                                 for n in counts))  # fmt: skip
    expected = await asyncio.gather(*(tokens(per_call.PrefillDecode(decode_request(n)))
                                      for n in counts))  # fmt: skip
    assert got == expected == [list(range(n)) for n in counts]
    assert servicer.num_sessions == 1
    assert client.PrefillDecode.num_open_calls == 0
    await client.close()


async def test_unary_replies_and_errors_keep_the_session(prefill: Any) -> None:
    servicer, _, channel = prefill
    client = PrefillClient(channel, sessions=True)
    assert (await client.Prefill(prefill_request(7), timeout=5)).first_token_id == 7
    servicer.error = errors.ResourceExhausted("engine busy", reason="ENGINE_BUSY")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.Prefill(prefill_request(7), timeout=5)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert from_rpc_error(caught.value).reason == "ENGINE_BUSY"
    servicer.error = None
    assert (await client.Prefill(prefill_request(3))).first_token_id == 3
    assert servicer.num_sessions == 1
    await client.close()


@pytest.mark.parametrize("error", errors_under_test(), ids=lambda e: e.reason)
async def test_errors_after_a_response_map_as_per_call(error: errors.EpdError) -> None:
    servicer = SessionEncodeService()
    servicer.encode_error = error
    server, endpoint = await start(encode_binding(servicer))
    channel = create_channel(endpoint)
    outcomes = []
    for sessions in (True, False):
        call = EncoderClient(channel, sessions=sessions).Encode(encode_request("a", "b"))
        first = await call.read()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        mapped = from_rpc_error(caught.value)
        outcomes.append((first.mm_hash, caught.value.code(), caught.value.details(),
                         mapped.reason, mapped.metadata))  # fmt: skip
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][3] == error.reason
    assert servicer.num_sessions == 1
    await channel.close()
    await server.drain_and_stop(0)


async def test_an_unexpected_exception_is_internal_without_details() -> None:
    servicer = SessionEncodeService()
    servicer.encode_error = RuntimeError("secret internals")
    server, endpoint = await start(encode_binding(servicer))
    channel = create_channel(endpoint)
    call = EncoderClient(channel, sessions=True).Encode(encode_request("a", "b"))
    await call.read()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (caught.value.details() or "")
    await channel.close()
    await server.drain_and_stop(0)


async def test_cancel_stops_the_server_side_call(prefill: Any) -> None:
    servicer, _, channel = prefill
    servicer.delay_s = 0.2
    client = PrefillClient(channel, sessions=True)
    call = client.PrefillDecode(decode_request(100))
    assert (await call.read()).token_ids == [0]
    assert call.cancel()
    await until(lambda: servicer.exits == ["CancelledError"])
    assert client.PrefillDecode.num_open_calls == 0
    assert await call.read() is grpc.aio.EOF
    servicer.delay_s = 0
    assert await tokens(client.PrefillDecode(decode_request(2))) == [0, 1]
    await client.close()


async def test_a_caller_cancelled_while_reading_cancels_its_call(prefill: Any) -> None:
    servicer, _, channel = prefill
    servicer.delay_s = 5
    client = PrefillClient(channel, sessions=True)
    reading = asyncio.ensure_future(tokens(client.PrefillDecode(decode_request(3))))
    await until(lambda: servicer.num_sessions == 1)
    await asyncio.sleep(0.1)
    reading.cancel()
    await until(lambda: servicer.exits == ["CancelledError"])
    await client.close()


async def test_deadline_ends_the_call_and_its_server_work(prefill: Any) -> None:
    servicer, _, channel = prefill
    servicer.delay_s = 5
    client = PrefillClient(channel, sessions=True)
    loop = asyncio.get_running_loop()
    start_s = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await tokens(client.PrefillDecode(decode_request(3), timeout=0.3))
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert loop.time() - start_s < 2
    await until(lambda: servicer.exits == ["CancelledError"])
    await client.close()


async def test_a_server_without_sessions_is_called_per_call() -> None:
    servicer = ScriptedEncodeService()  # no EncodeSession: UNIMPLEMENTED
    server, endpoint = await start(encode_binding(servicer))
    channel = create_channel(endpoint)
    client = EncoderClient(channel, sessions=True)
    first = await asyncio.gather(*(_hashes(client.Encode(encode_request(f"x{i}", "y"),
                                                          timeout=5)) for i in range(3)))
    assert first == [[f"x{i}", "y"] for i in range(3)]
    assert not client.Encode.supported
    assert await _hashes(client.Encode(encode_request("z"))) == ["z"]
    await client.close()
    client = EncoderClient(channel, sessions=True)  # NOTE: read() while falling back
    first_reads = await asyncio.gather(*(client.Encode(encode_request(f"r{i}")).read()
                                         for i in range(2)))  # fmt: skip
    assert [response.mm_hash for response in first_reads] == ["r0", "r1"]
    await client.close()
    await channel.close()
    await server.drain_and_stop(0)


async def test_a_server_that_goes_away_fails_calls_in_flight_then_a_new_one_is_used() -> None:
    servicer = ScriptedPrefillService()
    servicer.delay_s = 5
    server, endpoint = await start(prefill_binding(servicer))
    port = int(endpoint.rsplit(":", 1)[1])
    channel = create_channel(endpoint)
    client = PrefillClient(channel, sessions=True)
    call = client.PrefillDecode(decode_request(3), timeout=30)
    reading = asyncio.ensure_future(tokens(call))
    await until(lambda: servicer.num_sessions == 1)
    await server.drain_and_stop(0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await reading
    assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert client.PrefillDecode.num_open_calls == 0
    restarted = ScriptedPrefillService()
    server, _ = await start(prefill_binding(restarted), port=port)
    assert await tokens(client.PrefillDecode(decode_request(2), timeout=10)) == [0, 1]
    assert restarted.num_sessions == 1
    await client.close()
    await channel.close()
    await server.drain_and_stop(0)


async def test_drain_lets_calls_in_flight_finish_and_refuses_new_ones() -> None:
    servicer = ScriptedPrefillService()
    server, endpoint = await start(prefill_binding(servicer))
    channel = create_channel(endpoint)
    client = PrefillClient(channel, sessions=True)
    assert await tokens(client.PrefillDecode(decode_request(1))) == [0]
    servicer.delay_s = 0.1
    in_flight = asyncio.ensure_future(tokens(client.PrefillDecode(decode_request(5))))
    await until(lambda: client.PrefillDecode.num_open_calls == 1)
    await asyncio.sleep(0.05)
    draining = asyncio.ensure_future(server.drain_and_stop(5))
    await until(lambda: servicer.sessions.draining)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await tokens(client.PrefillDecode(decode_request(1)))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await in_flight == [0, 1, 2, 3, 4]
    await draining
    await client.close()
    await channel.close()


async def test_sessions_need_the_bearer_token() -> None:
    servicer = ScriptedPrefillService()
    server, endpoint = await start(prefill_binding(servicer), auth_token="s3cret")
    anonymous = create_channel(endpoint)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await tokens(PrefillClient(anonymous, sessions=True).PrefillDecode(decode_request(2)))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    authorised = create_channel(endpoint, auth_token="s3cret")
    client = PrefillClient(authorised, sessions=True)
    assert await tokens(client.PrefillDecode(decode_request(2))) == [0, 1]
    await client.close()
    for channel in (anonymous, authorised):
        await channel.close()
    await server.drain_and_stop(0)


async def test_wire_frames_last_response_ends_a_call_and_duplicate_ids_are_refused(
        prefill: Any) -> None:  # fmt: skip
    servicer, _, channel = prefill
    servicer.delay_s = 0.2
    stream = prefill_grpc.PrefillServiceStub(channel).PrefillDecodeSession()
    frame = prefill_pb.PrefillDecodeSessionRequest
    await stream.write(frame(call_id=1, request=decode_request(2)))
    await stream.write(frame(call_id=1, request=decode_request(2)))
    refusal = await stream.read()
    assert (refusal.call_id, refusal.WhichOneof("frame")) == (1, "end")
    assert refusal.end.code == grpc.StatusCode.UNAVAILABLE.value[0]
    frames = [await stream.read(), await stream.read()]
    assert [(f.call_id, list(f.response.token_ids), f.last) for f in frames] == [
        (1, [0], False), (1, [1], True)]
    await stream.done_writing()
    assert await stream.read() is grpc.aio.EOF  # no CallEnd after the last response
    assert await stream.code() == grpc.StatusCode.OK


async def _hashes(call: Any) -> list[str]:
    return [response.mm_hash async for response in call]


async def test_a_traced_server_serves_sessions_untraced(spans: Any) -> None:
    server, endpoint = await start(encode_binding(SessionEncodeService()))
    frame = encode_pb.EncodeSessionRequest(call_id=1, request=encode_request("h0", "h1"))
    async with grpc.aio.insecure_channel(endpoint) as channel:
        call = encode_grpc.EncodeServiceStub(channel).EncodeSession(iter([frame]), timeout=5)
        replies = [reply async for reply in call]
    await server.drain_and_stop(0)
    assert [reply.response.mm_hash for reply in replies] == ["h0", "h1"]
    assert replies[-1].last
    assert not [s for s in spans.get_finished_spans() if s.name.endswith("Session")]
