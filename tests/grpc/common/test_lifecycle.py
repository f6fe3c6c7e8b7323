"""Call and process lifecycle: handler aborts, client cancellation, signals, auth on streams."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epd.common import errors
from epd.common.channels import TlsFiles, create_channel, wait_for_health
from epd.common.server import EpdServer, ServerOptions, build_server
from epd.common.server_tls import ServerTls
from epd.common.serving import serve
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding, self_signed_cert


async def start(servicer: ScriptedEncodeService, **options) -> tuple[EpdServer, str]:
    server, port = await build_server([encode_binding(servicer)], ServerOptions(**options))
    return server, f"127.0.0.1:{port}"


def encode_request(num_items: int) -> encode_pb.EncodeRequest:
    items = [multimodal_pb2.MediaItem(mm_hash=str(i), url="data:,") for i in range(num_items)]
    return encode_pb.EncodeRequest(items=items)


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_abort_by_the_handler_itself_keeps_its_code() -> None:
    servicer = ScriptedEncodeService()
    servicer.release_abort = grpc.StatusCode.PERMISSION_DENIED
    server, endpoint = await start(servicer)
    async with create_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await encode_grpc.EncodeServiceStub(channel).Release(encode_pb.ReleaseRequest())
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == "aborted by the handler itself"
    await server.drain_and_stop(0)


async def test_client_cancel_reaches_the_streaming_handler() -> None:
    servicer = ScriptedEncodeService()
    servicer.item_delay_s = 0.5
    server, endpoint = await start(servicer)
    async with create_channel(endpoint) as channel:
        call = encode_grpc.EncodeServiceStub(channel).Encode(encode_request(10))
        await call.read()
        call.cancel()
        await wait_until(lambda: bool(servicer.encode_exits))
    # NOTE: the handler saw the cancellation (not an INTERNAL abort) and its cleanup ran.
    assert servicer.encode_exits in (["CancelledError"], ["GeneratorExit"])
    await server.drain_and_stop(0)


async def test_streaming_rpc_needs_the_token_too() -> None:
    server, endpoint = await start(ScriptedEncodeService(), auth_token="s3cret")
    async with create_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in encode_grpc.EncodeServiceStub(channel).Encode(encode_request(1)):
                pass
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with create_channel(endpoint, auth_token="s3cret") as channel:
        stream = encode_grpc.EncodeServiceStub(channel).Encode(encode_request(2))
        assert [r.mm_hash async for r in stream] == ["0", "1"]
    await server.drain_and_stop(0)


async def test_sigterm_drains_in_flight_work_then_serve_returns() -> None:
    servicer = ScriptedEncodeService()
    servicer.item_delay_s = 0.1
    server, endpoint = await start(servicer, drain_grace_s=5.0)
    await server.mark_serving()
    drained: list[bool] = []

    async def on_drain() -> None:
        drained.append(True)

    server.add_drain_callback(on_drain)
    running = asyncio.ensure_future(serve(server))
    await asyncio.sleep(0)  # serve installs its signal handlers before its first await
    async with create_channel(endpoint) as channel:
        call = encode_grpc.EncodeServiceStub(channel).Encode(encode_request(5))
        first = await call.read()
        os.kill(os.getpid(), signal.SIGTERM)
        rest = []
        while (response := await call.read()) is not grpc.aio.EOF:
            rest.append(response.mm_hash)
    await asyncio.wait_for(running, 5.0)
    assert [first.mm_hash, *rest] == ["0", "1", "2", "3", "4"]
    assert drained == [True] and servicer.encode_exits == ["done"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers removed again


async def test_second_signal_stops_without_waiting_for_the_grace() -> None:
    servicer = ScriptedEncodeService()
    servicer.item_delay_s = 1.0
    server, endpoint = await start(servicer, drain_grace_s=30.0)
    running = asyncio.ensure_future(serve(server))
    await asyncio.sleep(0)
    async with create_channel(endpoint) as channel:
        call = encode_grpc.EncodeServiceStub(channel).Encode(encode_request(60))
        await call.read()
        started = asyncio.get_running_loop().time()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(running, 5.0)
        with pytest.raises(grpc.aio.AioRpcError):
            while await call.read() is not grpc.aio.EOF:
                pass
    assert asyncio.get_running_loop().time() - started < 5.0


async def test_serve_returns_when_the_server_stops_by_itself() -> None:
    server, _ = await start(ScriptedEncodeService())
    running = asyncio.ensure_future(serve(server))
    await asyncio.sleep(0)
    await server.grpc_server.stop(0)
    await asyncio.wait_for(running, 5.0)


async def test_health_ignores_mark_serving_once_draining() -> None:
    server, endpoint = await start(ScriptedEncodeService(), drain_grace_s=1.0)

    async def mark_serving_late() -> None:
        await server.mark_serving()  # e.g. a warm-up that finishes while draining
        async with grpc.aio.insecure_channel(endpoint) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING

    checked: list[bool] = []

    async def check() -> None:
        await mark_serving_late()
        checked.append(True)

    server.add_drain_callback(check)
    await server.drain_and_stop()
    assert checked == [True]


async def test_failing_drain_callback_does_not_block_the_stop() -> None:
    server, endpoint = await start(ScriptedEncodeService())
    ran: list[str] = []

    async def broken() -> None:
        ran.append("broken")
        raise errors.Unavailable("scheduler gone")

    async def second() -> None:
        ran.append("second")

    server.add_drain_callback(broken)
    server.add_drain_callback(second)
    await asyncio.gather(server.drain_and_stop(0), server.drain_and_stop(0))
    assert ran == ["broken", "second"]  # each ran once although drain was asked twice
    await asyncio.wait_for(server.wait_for_termination(), 2.0)


async def test_mutual_tls_requires_a_client_certificate_signed_by_the_client_ca(tmp_path) -> None:
    server_cert, server_key = self_signed_cert(tmp_path, "localhost")
    client_cert, client_key = self_signed_cert(tmp_path, "client")
    stranger_cert, stranger_key = self_signed_cert(tmp_path, "stranger")
    server, port = await build_server(
        [encode_binding(ScriptedEncodeService())],
        ServerOptions(tls=ServerTls(server_cert, server_key, client_cert)),
    )
    endpoint, request = f"localhost:{port}", encode_pb.ReleaseRequest(lease_ids=["a"])
    tls = TlsFiles(ca_file=server_cert, cert_file=client_cert, key_file=client_key)
    async with create_channel(endpoint, tls=tls) as channel:
        reply = await encode_grpc.EncodeServiceStub(channel).Release(request)
    assert reply.num_released == 1
    for cert, key in ((None, None), (stranger_cert, stranger_key)):
        refused = TlsFiles(ca_file=server_cert, cert_file=cert, key_file=key)
        async with create_channel(endpoint, tls=refused) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await encode_grpc.EncodeServiceStub(channel).Release(request, timeout=2.0)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    await server.mark_serving()
    await wait_for_health(endpoint, timeout_s=2.0, tls=tls)
    await server.drain_and_stop(0)
