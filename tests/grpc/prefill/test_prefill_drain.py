"""A draining prefill worker (KV producer) refuses new prefills but keeps its engine serving
until the decode worker pulled the KV it handed off (or the grace ends)."""

from __future__ import annotations

import asyncio

import grpc

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.common.status import from_rpc_error
from epd.server.engine.base import EngineLoad
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as pb
from epd.v1 import prefill_service_pb2_grpc as pb_grpc
from tests.engines import CannedEngine


class KvProducerEngine(CannedEngine):
    """Prefills at once; holds the KV (usage above zero) until ``pull`` is called."""

    def __init__(self) -> None:
        super().__init__(kv_transfer_params={"remote_block_ids": [1]})
        self.num_pulled = 0

    def pull(self) -> None:
        self.num_pulled += 1

    def load(self) -> EngineLoad:
        return EngineLoad(kv_usage=0.25 * (self.num_prefilled - self.num_pulled))


async def prefill(port: int, request_id: str) -> pb.PrefillResponse:
    request = pb.PrefillRequest(
        request_id=request_id, model="tiny", prompt=generation_pb2.Prompt(token_ids=[1, 2, 3])
    )
    async with create_channel(f"127.0.0.1:{port}") as channel:
        response: pb.PrefillResponse = await pb_grpc.PrefillServiceStub(channel).Prefill(request)
    return response


async def test_handed_off_kv_keeps_the_worker_up_until_pulled(tiny_model_dir) -> None:
    engine = KvProducerEngine()
    app = await build_prefill_server(PrefillConfig(tiny_model_dir, mode=Role.PREFILL), engine)
    response = await prefill(app.port, "one")
    assert response.first_token_id == 7
    stopping = asyncio.ensure_future(app.stop(grace=10.0))
    await asyncio.sleep(0.3)
    assert not stopping.done()
    try:
        await prefill(app.port, "two")
        raise AssertionError("a draining worker took a new prefill")
    except grpc.aio.AioRpcError as refused:
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert from_rpc_error(refused).reason == "DRAINING"
    engine.pull()  # the decode worker read the KV
    await asyncio.wait_for(stopping, 2.0)
