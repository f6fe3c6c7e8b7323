"""A prefill worker whose engine is busy answers RESOURCE_EXHAUSTED ``ENGINE_BUSY`` over gRPC, and
a call cancelled by its client aborts its request in the engine (a fake AsyncLLM, no engine)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from epd.common.channels import create_channel
from epd.common.status import from_rpc_error
from epd.server.engine.vllm_engine import VllmEngine
from epd.server.engine.vllm_options import VllmOptions
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from tests.unit.engine.test_vllm_admission import LAYOUT, PROMPT, FakeLlm


async def test_engine_busy_reaches_grpc_clients(tmp_path: Path) -> None:
    llm = FakeLlm()
    engine = VllmEngine(llm, "tiny", LAYOUT, VllmOptions(max_pending_requests=1))
    app = await build_prefill_server(PrefillConfig(tmp_path), engine)
    sampling = generation_pb2.SamplingParams(max_tokens=4, ignore_eos=True)

    def request(request_id: str) -> prefill_pb.PrefillDecodeRequest:
        return prefill_pb.PrefillDecodeRequest(
            request_id=request_id,
            model="tiny",
            sampling=sampling,
            prompt=generation_pb2.Prompt(token_ids=PROMPT),
        )

    try:
        async with create_channel(f"127.0.0.1:{app.port}") as channel:
            stub = prefill_grpc.PrefillServiceStub(channel)
            holding = stub.PrefillDecode(request("a"))
            assert list((await holding.read()).token_ids) == [7]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                _ = [r async for r in stub.PrefillDecode(request("b"))]
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert from_rpc_error(caught.value).reason == "ENGINE_BUSY"
            holding.cancel()
            await wait_for_abort(llm, "a")
    finally:
        await app.stop()


async def wait_for_abort(llm: FakeLlm, request_id: str) -> None:
    for _ in range(100):
        if request_id in llm.aborted:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{request_id} was not aborted after its call was cancelled")
