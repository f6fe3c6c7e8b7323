"""The shared server scaffold: health, reflection, error mapping, drain, auth, TLS, tracing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_status import rpc_status

from epd.common import errors
from epd.common.channels import TlsFiles, create_channel, wait_for_health
from epd.common.server import ServerOptions, build_server
from epd.common.server_tls import ServerTls
from epd.common.status import error_info, from_rpc_error
from epd.common.telemetry import JsonLinesSpanExporter, make_exporter
from epd.launch.free_ports import free_port
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.common.servicers import (
    ScriptedEncodeService,
    encode_binding,
    errors_under_test,
    self_signed_cert,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def start(servicer: ScriptedEncodeService, **options):
    server, port = await build_server([encode_binding(servicer)], ServerOptions(**options))
    return server, f"127.0.0.1:{port}"


async def health_status(endpoint: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
        return int(reply.status)


async def test_health_not_serving_until_marked_then_not_serving_on_drain() -> None:
    server, endpoint = await start(ScriptedEncodeService())
    assert await health_status(endpoint) == NOT_SERVING
    assert await health_status(endpoint, "epd.v1.EncodeService") == NOT_SERVING
    await server.mark_serving()
    assert await health_status(endpoint, "epd.v1.EncodeService") == SERVING
    await wait_for_health(endpoint, timeout_s=2)
    seen_while_draining: list[int] = []

    async def check_health() -> None:  # drain callbacks run while the server still answers
        seen_while_draining.append(await health_status(endpoint))
        seen_while_draining.append(await health_status(endpoint, "epd.v1.EncodeService"))

    server.add_drain_callback(check_health)
    await server.drain_and_stop(0)
    assert seen_while_draining == [NOT_SERVING, NOT_SERVING]


async def test_health_watch_streams_status_changes_on_a_traced_server(spans) -> None:
    server, endpoint = await start(ScriptedEncodeService())
    async with grpc.aio.insecure_channel(endpoint) as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service="epd.v1.EncodeService")
        )
        seen = [(await call.read()).status]
        await server.mark_serving()
        seen.append((await call.read()).status)
        call.cancel()
    await server.drain_and_stop(0)
    assert seen == [NOT_SERVING, SERVING]
    assert not [s for s in spans.get_finished_spans() if "grpc.health" in s.name]


async def test_wait_for_health_times_out_with_a_clear_error() -> None:
    server, endpoint = await start(ScriptedEncodeService())
    with pytest.raises(errors.Unavailable, match="not healthy") as caught:
        await wait_for_health(endpoint, timeout_s=0.3)
    assert caught.value.reason == "NOT_HEALTHY"
    await server.drain_and_stop(0)


async def test_reflection_lists_services_and_resolves_methods() -> None:
    server, endpoint = await start(ScriptedEncodeService())

    def list_with_reflection_client() -> tuple[set[str], set[str]]:
        with grpc.insecure_channel(endpoint) as channel:
            database = ProtoReflectionDescriptorDatabase(channel)
            file = database.FindFileContainingSymbol("epd.v1.EncodeService")
            return set(database.get_services()), {m.name for m in file.service[0].method}

    services, methods = await asyncio.to_thread(list_with_reflection_client)
    assert {
        "epd.v1.EncodeService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services
    assert methods == {"Encode", "Release"}
    await server.drain_and_stop(0)


@pytest.mark.parametrize("error", errors_under_test(), ids=lambda e: e.reason)
async def test_unary_errors_carry_code_reason_and_metadata(error: errors.EpdError) -> None:
    servicer = ScriptedEncodeService()
    servicer.release_error = error
    server, endpoint = await start(servicer)

    def call_with_sync_client() -> grpc.RpcError:
        with grpc.insecure_channel(endpoint) as channel:
            stub = encode_grpc.EncodeServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Release(encode_pb.ReleaseRequest(lease_ids=["a"]))
        return caught.value

    failure = await asyncio.to_thread(call_with_sync_client)
    status = rpc_status.from_call(failure)
    assert status is not None
    assert grpc.StatusCode[error.code.value].value[0] == status.code
    assert status.message == error.message
    info = error_info(failure)
    assert info is not None and info.reason == error.reason and info.domain == "epd"
    assert dict(info.metadata) == error.metadata
    back = from_rpc_error(failure)
    assert type(back) is type(error) and back.reason == error.reason
    assert back.metadata == error.metadata
    await server.drain_and_stop(0)


async def test_streaming_error_after_first_item_is_mapped() -> None:
    servicer = ScriptedEncodeService()
    servicer.encode_error = errors.InvalidArgument("second image is broken", reason="BAD_IMAGE")
    server, endpoint = await start(servicer)
    items = [multimodal_pb2.MediaItem(mm_hash=h, url="data:,") for h in ("a", "b")]
    async with create_channel(endpoint) as channel:
        call = encode_grpc.EncodeServiceStub(channel).Encode(encode_pb.EncodeRequest(items=items))
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for response in call:
                received.append(response.mm_hash)
    assert received == ["a"]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == "BAD_IMAGE"
    await server.drain_and_stop(0)


async def test_an_unreachable_peer_is_named_and_a_server_error_keeps_its_reason() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    async with create_channel(endpoint) as channel:
        stub = encode_grpc.EncodeServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Release(encode_pb.ReleaseRequest(), timeout=5)
    error = from_rpc_error(caught.value, endpoint)
    assert isinstance(error, errors.Unavailable) and error.reason == "PEER_UNREACHABLE"
    assert endpoint in str(error) and error.metadata == {"endpoint": endpoint}
    assert from_rpc_error(caught.value).reason == "UNAVAILABLE"  # NOTE: no peer: the code alone
    servicer = ScriptedEncodeService()
    servicer.release_error = errors.Unavailable("draining", reason="DRAINING")
    server, endpoint = await start(servicer)
    async with create_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await encode_grpc.EncodeServiceStub(channel).Release(encode_pb.ReleaseRequest())
    assert from_rpc_error(caught.value, endpoint).reason == "DRAINING"
    await server.drain_and_stop(0)


async def test_unexpected_exception_is_internal_without_internals() -> None:
    servicer = ScriptedEncodeService()
    servicer.release_error = KeyError("secret-internal-detail")
    server, endpoint = await start(servicer)
    async with create_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await encode_grpc.EncodeServiceStub(channel).Release(encode_pb.ReleaseRequest())
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (caught.value.details() or "")
    assert isinstance(from_rpc_error(caught.value), errors.Internal)
    await server.drain_and_stop(0)


async def test_drain_lets_in_flight_stream_finish_and_refuses_new_calls() -> None:
    servicer = ScriptedEncodeService()
    servicer.item_delay_s = 0.2
    server, endpoint = await start(servicer)
    drained: list[str] = []

    async def on_drain() -> None:
        drained.append("deregistered")

    server.add_drain_callback(on_drain)
    items = [multimodal_pb2.MediaItem(mm_hash=str(i), url="data:,") for i in range(4)]
    async with create_channel(endpoint) as channel:
        stub = encode_grpc.EncodeServiceStub(channel)
        call = stub.Encode(encode_pb.EncodeRequest(items=items))
        first = await call.read()
        drain = asyncio.ensure_future(server.drain_and_stop(5.0))
        rest = [response async for response in call]
        await drain
    assert [first.mm_hash, *(r.mm_hash for r in rest)] == ["0", "1", "2", "3"]
    assert drained == ["deregistered"]
    async with create_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await encode_grpc.EncodeServiceStub(channel).Release(
                encode_pb.ReleaseRequest(), timeout=1.0
            )
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_bearer_token_required_except_for_health() -> None:
    server, endpoint = await start(ScriptedEncodeService(), auth_token="s3cret")
    await server.mark_serving()
    request = encode_pb.ReleaseRequest(lease_ids=["x"])
    for token in (None, "wrong"):
        async with create_channel(endpoint, auth_token=token) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await encode_grpc.EncodeServiceStub(channel).Release(request)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert from_rpc_error(caught.value).reason == "UNAUTHENTICATED"
    async with create_channel(endpoint, auth_token="s3cret") as channel:
        reply = await encode_grpc.EncodeServiceStub(channel).Release(request)
    assert reply.num_released == 1
    assert await health_status(endpoint) == SERVING
    await server.drain_and_stop(0)


async def test_tls_server_accepts_a_channel_that_trusts_its_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    server, port = await build_server(
        [encode_binding(ScriptedEncodeService())],
        ServerOptions(tls=ServerTls(cert, key)),
    )
    async with create_channel(f"localhost:{port}", tls=TlsFiles(ca_file=cert)) as channel:
        reply = await encode_grpc.EncodeServiceStub(channel).Release(
            encode_pb.ReleaseRequest(lease_ids=["a", "b"])
        )
    assert reply.num_released == 2
    async with grpc.aio.insecure_channel(f"localhost:{port}") as plain:
        with pytest.raises(grpc.aio.AioRpcError):
            await encode_grpc.EncodeServiceStub(plain).Release(
                encode_pb.ReleaseRequest(), timeout=2.0
            )
    await server.drain_and_stop(0)


def test_server_options_reject_bad_settings() -> None:
    with pytest.raises(ValueError, match="port"):
        ServerOptions(port=70000)
    with pytest.raises(ValueError, match="certificate and a key"):
        ServerOptions(tls=ServerTls(cert_file="cert.pem"))
    with pytest.raises(ValueError, match="certificate and a key"):
        ServerOptions(tls=ServerTls(key_file="key.pem"))
    with pytest.raises(ValueError, match="mTLS"):
        ServerOptions(tls=ServerTls(client_ca_file="ca.pem"))


async def test_trace_context_crosses_two_servers(spans) -> None:
    downstream, downstream_endpoint = await start(ScriptedEncodeService())
    upstream_servicer = ScriptedEncodeService()

    async def call_downstream() -> None:
        async with create_channel(downstream_endpoint) as channel:
            await encode_grpc.EncodeServiceStub(channel).Release(encode_pb.ReleaseRequest())

    upstream_servicer.on_release = call_downstream
    upstream, upstream_endpoint = await start(upstream_servicer)
    async with create_channel(upstream_endpoint) as channel:
        await encode_grpc.EncodeServiceStub(channel).Release(encode_pb.ReleaseRequest())
    await upstream.drain_and_stop(0)
    await downstream.drain_and_stop(0)
    finished = [s for s in spans.get_finished_spans() if s.name == "/epd.v1.EncodeService/Release"]
    by_id = {s.context.span_id: s for s in finished}
    server_spans = [s for s in finished if s.kind.name == "SERVER"]
    assert len(server_spans) == 2 and len({s.context.trace_id for s in finished}) == 1
    inner = next(
        s
        for s in server_spans
        if s.parent
        and s.parent.span_id in by_id
        and by_id[s.parent.span_id].kind.name == "CLIENT"
        and by_id[s.parent.span_id].parent is not None
    )
    client = by_id[inner.parent.span_id]
    assert client.parent.span_id in {s.context.span_id for s in server_spans if s is not inner}


def test_json_exporter_appends_parseable_lines(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    path = tmp_path / "spans.jsonl"
    parsed = make_exporter(f"json:{path}")
    assert parsed is not None and isinstance(parsed[0], JsonLinesSpanExporter)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(parsed[0]))
    for name in ("one", "two"):
        with provider.get_tracer("t").start_as_current_span(name) as span:
            span.set_attribute("epd.request_id", "r1")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["name"] for line in lines] == ["one", "two"]
    assert lines[0]["attributes"]["epd.request_id"] == "r1"
    with pytest.raises(ValueError, match="unknown trace exporter"):
        make_exporter("zipkin")
