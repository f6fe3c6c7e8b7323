"""Requests that do not parse (garbage bytes, a string field holding invalid UTF-8) answer
INVALID_ARGUMENT with reason BAD_MESSAGE on every service and every kind of RPC, and leave one
log line, no traceback."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2

from epd.common.server import ServerOptions, build_server
from epd.common.status import error_info
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding

TOKEN = "s3cret"
GARBAGE = b"\xff\xff\xff\xff\x0f"  # NOTE: field 0 with a truncated varint: never parses
# ReleaseRequest.lease_ids (field 1, length-delimited) holding two bytes that are not UTF-8.
BAD_UTF8 = b"\x0a\x02\xc3\x28"
# ServerReflectionRequest.host (field 1) holding two bytes that are not UTF-8.
BAD_UTF8_FRAME = b"\x0a\x02\xc3\x28"
BAD_PAYLOADS = {"garbage": GARBAGE, "bad-utf8": BAD_UTF8}


@pytest.fixture(params=["plain", "auth", "traced"])
async def endpoint(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """An encoder server, plain, with auth, or traced."""
    if request.param == "traced":
        request.getfixturevalue("spans")
    options = ServerOptions(auth_token=TOKEN if request.param == "auth" else None)
    server, port = await build_server([encode_binding(ScriptedEncodeService())], options)
    await server.mark_serving()
    yield f"127.0.0.1:{port}"
    await server.drain_and_stop(0)


async def call_raw(
    endpoint: str, method: str, payloads: list[bytes], *, streaming: tuple[bool, bool]
) -> grpc.aio.AioRpcError:
    """Send ``payloads`` as they are to ``method``; the error the call ends with."""
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    async with grpc.aio.insecure_channel(endpoint) as channel:
        try:
            match streaming:
                case (False, False):
                    await channel.unary_unary(method)(payloads[0], metadata=metadata, timeout=5)
                case (False, True):
                    call = channel.unary_stream(method)(payloads[0], metadata=metadata, timeout=5)
                    _ = [response async for response in call]
                case _:
                    call = channel.stream_stream(method)(
                        iter(payloads), metadata=metadata, timeout=5
                    )
                    _ = [response async for response in call]
        except grpc.aio.AioRpcError as e:
            return e
    raise AssertionError(f"{method} accepted {payloads!r}")


def assert_bad_message(error: grpc.aio.AioRpcError, caplog: pytest.LogCaptureFixture) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    info = error_info(error)
    assert info is not None and info.reason == "BAD_MESSAGE"
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 1, caplog.text


@pytest.mark.parametrize("payload", BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
async def test_a_unary_call_that_does_not_parse_is_invalid_argument(
    endpoint: str, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    error = await call_raw(
        endpoint, "/epd.v1.EncodeService/Release", [payload], streaming=(False, False)
    )
    assert_bad_message(error, caplog)


async def test_a_server_streaming_call_that_does_not_parse_is_invalid_argument(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    error = await call_raw(
        endpoint, "/epd.v1.EncodeService/Encode", [GARBAGE], streaming=(False, True)
    )
    assert_bad_message(error, caplog)


@pytest.mark.parametrize("payload", [GARBAGE, BAD_UTF8_FRAME], ids=["garbage", "bad-utf8"])
async def test_a_stream_frame_that_does_not_parse_is_invalid_argument(
    endpoint: str, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    good = reflection_pb2.ServerReflectionRequest(list_services="")
    error = await call_raw(
        endpoint,
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        [good.SerializeToString(), payload],
        streaming=(True, True),
    )
    assert_bad_message(error, caplog)


async def test_health_checks_that_do_not_parse_are_invalid_argument(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    error = await call_raw(
        endpoint, "/grpc.health.v1.Health/Check", [GARBAGE], streaming=(False, False)
    )
    assert_bad_message(error, caplog)


async def test_without_credentials_a_bad_message_is_still_unauthenticated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, port = await build_server(
        [encode_binding(ScriptedEncodeService())], ServerOptions(auth_token=TOKEN)
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary("/epd.v1.EncodeService/Release")(GARBAGE, timeout=5)
    await server.drain_and_stop(0)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Traceback" not in caplog.text
