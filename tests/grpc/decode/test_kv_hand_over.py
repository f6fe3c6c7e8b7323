"""A KV handle crosses Prefill -> Decode as opaque bytes: the decode engine gets exactly the
kv_transfer_params the prefill engine returned (ints as ints, nesting kept), and a Decode whose
handle is empty or not one a prefill worker returned answers INVALID_ARGUMENT with its reason,
never an INTERNAL error with a traceback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.common.status import from_rpc_error
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.engine.base import Sampling, TokenChunk, Usage
from epd.server.engine.vllm_embeds import IMAGE_GRIDS_KEY, IMAGE_HASHES_KEY
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from tests.engines import CannedEngine

HANDLE = {
    "do_remote_prefill": True,
    "remote_block_ids": [[1, 2], [3]],
    "remote_port": 5601,
    "remote_engine_id": "e1",
    "remote_blocks_expiry_time": None,
    "lease": {"seconds": 30, "ratio": 0.5},
    IMAGE_GRIDS_KEY: [[1, 4, 6]],
    IMAGE_HASHES_KEY: ["a"],
}
TEXT_PROMPT = generation_pb2.Prompt(token_ids=[1, 2, 3])


class HandOverEngine(CannedEngine):
    """A KV producer returning ``HANDLE`` and a KV consumer recording what it was given."""

    def __init__(self) -> None:
        super().__init__(kv_transfer_params=HANDLE)
        self.received: list[dict[str, Any]] = []

    async def decode(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        first_token_id: int,
        kv_transfer_params: dict[str, Any],
    ) -> AsyncIterator[TokenChunk]:
        self.received.append(kv_transfer_params)
        yield TokenChunk([8, 9], "stop", Usage(len(prompt_token_ids), 3))


@pytest.fixture
async def ports(tiny_model_dir) -> AsyncIterator[tuple[int, int, HandOverEngine]]:
    engine = HandOverEngine()
    producer = await build_prefill_server(PrefillConfig(tiny_model_dir, mode=Role.PREFILL), engine)
    consumer = await build_decode_server(DecodeConfig(), engine)
    yield producer.port, consumer.port, engine
    await consumer.stop()
    await producer.stop()


async def decode(port: int, handle: generation_pb2.KvHandle) -> list[int]:
    request = decode_pb.DecodeRequest(
        request_id="r", model="tiny", prompt_token_ids=[1, 2, 3], first_token_id=7, kv_handle=handle
    )
    async with create_channel(f"127.0.0.1:{port}") as channel:
        stream = decode_grpc.DecodeServiceStub(channel).Decode(request)
        return [token async for response in stream for token in response.token_ids]


async def test_the_decode_engine_gets_the_prefill_engine_s_params_exactly(ports) -> None:
    prefill_port, decode_port, engine = ports
    async with create_channel(f"127.0.0.1:{prefill_port}") as channel:
        reply = await prefill_grpc.PrefillServiceStub(channel).Prefill(
            prefill_pb.PrefillRequest(request_id="r", model="tiny", prompt=TEXT_PROMPT)
        )
    assert reply.kv_handle.engine_id == "e1"
    assert await decode(decode_port, reply.kv_handle) == [8, 9]
    [params] = engine.received
    assert params == HANDLE, "the images' lists too: the decode engine reads them"
    assert type(params["remote_port"]) is int and type(params["lease"]["seconds"]) is int


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "MISSING_KV_HANDLE"),
        (b"{not json", "BAD_KV_HANDLE"),
        (b"[1, 2, 3]", "BAD_KV_HANDLE"),
    ],
    ids=["empty", "not-json", "not-an-object"],
)
async def test_a_handle_that_is_not_a_prefill_s_is_invalid_argument(
    ports, payload: bytes, reason: str
) -> None:
    _, decode_port, engine = ports
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await decode(decode_port, generation_pb2.KvHandle(payload=payload))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert from_rpc_error(caught.value).reason == reason
    assert "Traceback" not in (caught.value.details() or "")
    assert engine.received == []
