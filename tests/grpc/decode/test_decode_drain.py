"""A draining decode worker refuses new decodes (UNAVAILABLE, reason DRAINING) but keeps serving
until its engine runs nothing: the streams it took finish whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from epd.common.channels import create_channel
from epd.common.status import from_rpc_error
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.engine.base import EngineLoad, Sampling, TokenChunk, Usage
from epd.v1 import decode_service_pb2 as pb
from epd.v1 import decode_service_pb2_grpc as pb_grpc
from epd.v1 import generation_pb2
from tests.engines import CannedEngine


class HeldDecodeEngine(CannedEngine):
    """Streams one token, then holds each decode until ``finish`` is called; counts it running
    meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.finishing = asyncio.Event()
        self.num_running = 0

    def finish(self) -> None:
        self.finishing.set()

    def load(self) -> EngineLoad:
        return EngineLoad(num_running=self.num_running)

    async def decode(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        first_token_id: int,
        kv_transfer_params: dict[str, Any],
    ) -> AsyncIterator[TokenChunk]:
        self.num_running += 1
        try:
            yield TokenChunk([8])
            await self.finishing.wait()
            yield TokenChunk([9], "stop", Usage(3, 3))
        finally:
            self.num_running -= 1


def decode_call(channel: grpc.aio.Channel, request_id: str) -> Any:
    request = pb.DecodeRequest(
        request_id=request_id,
        model="tiny",
        first_token_id=7,
        kv_handle=generation_pb2.KvHandle(payload=b'{"remote_block_ids": [1]}'),
    )
    return pb_grpc.DecodeServiceStub(channel).Decode(request)


async def test_a_draining_decode_worker_refuses_new_decodes_and_finishes_its_own() -> None:
    engine = HeldDecodeEngine()
    app = await build_decode_server(DecodeConfig(), engine)
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        running = decode_call(channel, "one")
        assert list((await running.read()).token_ids) == [8]
        stopping = asyncio.ensure_future(app.stop(grace=10.0))
        await asyncio.sleep(0.3)
        assert not stopping.done() and not app.worker.drain.is_settled()
        try:
            await decode_call(channel, "two").read()
            raise AssertionError("a draining decode worker took a new decode")
        except grpc.aio.AioRpcError as refused:
            assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
            assert from_rpc_error(refused).reason == "DRAINING"
        engine.finish()
        assert list((await running.read()).token_ids) == [9]
        await asyncio.wait_for(stopping, 2.0)
    assert engine.num_running == 0
