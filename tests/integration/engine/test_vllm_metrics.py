"""A prefill and a decode worker on vLLM engines, scraped over HTTP: vLLM's own metrics come out
unchanged (prompt and generated tokens, KV bytes pulled over NIXL) beside the worker's own
embedding hand-off times, and they count what the requests did."""

from __future__ import annotations

import asyncio

import pytest

from epd.common.roles import Role
from epd.common.server import ServerOptions
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.transfer.plane import DataPlane
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from tests.integration.conftest import KV_CACHE_BYTES
from tests.pictures import picture
from tests.scrape import scrape

from .helpers import Stubs, embedded_prompt, release

pytestmark = pytest.mark.vllm
NUM_TOKENS = 6
GREEDY = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)


def total(samples, name: str) -> float:
    """The sum of every sample called ``name`` (vLLM labels by model and engine)."""
    return sum(s.value for s in samples if s.name == name)


async def samples_of(app) -> list:
    return await asyncio.to_thread(scrape, f"http://127.0.0.1:{app.server.metrics.port}/metrics")


@pytest.fixture(scope="module")
async def fresh_engines(tiny_model_dir):
    """A producer and, started after it, a consumer of their own. vLLM keeps its metrics in
    prometheus-client's process-wide registry and every engine that starts unregisters the
    ``vllm:*`` collectors there before adding its own (one engine per process, as epd runs
    them), so the session's engines have lost theirs to whichever engine a test started last."""
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions

    def options(role: str) -> VllmOptions:
        return VllmOptions(kv_role=role, kv_cache_bytes=KV_CACHE_BYTES, max_model_len=2048)

    producer = await VllmEngine.start(
        tiny_model_dir, model_id="tiny", options=options("kv_producer")
    )
    consumer = await VllmEngine.start(
        tiny_model_dir, model_id="tiny", options=options("kv_consumer")
    )
    yield producer, consumer
    await asyncio.gather(producer.close(), consumer.close())


async def test_prefill_and_decode_export_vllms_metrics_and_their_own(
    tiny_model_dir, fresh_engines, oracle
) -> None:
    """The decode worker's engine started last, so its figures are the ones vLLM exports: the
    prompt's tokens (it takes the prompt whose KV it pulls) and the KV bytes it pulled."""
    stubs = Stubs(fresh_engines)
    options = ServerOptions(metrics_port=0)
    prefill_app = await build_prefill_server(
        PrefillConfig(tiny_model_dir, mode=Role.PREFILL), stubs.producer, options
    )
    decode_app = await build_decode_server(DecodeConfig(), stubs.consumer, options)
    prefill = await stubs.serve(prefill_app, prefill_grpc.PrefillServiceStub)
    decode = await stubs.serve(decode_app, decode_grpc.DecodeServiceStub)
    plane = DataPlane(prefill_app.worker.plane.host_id)
    try:
        before = await samples_of(prefill_app)
        before_decode = await samples_of(decode_app)
        prompt = embedded_prompt(oracle, plane, [picture(3, 96, 64)], "what is this")
        first = await prefill.Prefill(
            prefill_pb.PrefillRequest(
                request_id="metrics-1", model="tiny", prompt=prompt, sampling=GREEDY
            )
        )
        tokens = [
            t
            async for r in decode.Decode(
                decode_pb.DecodeRequest(
                    request_id="metrics-1",
                    model="tiny",
                    prompt_token_ids=prompt.token_ids,
                    sampling=GREEDY,
                    first_token_id=first.first_token_id,
                    kv_handle=first.kv_handle,
                )
            )
            for t in r.token_ids
        ]
        release(plane, prompt)
        await asyncio.sleep(1.5)  # NOTE: vLLM records a step's figures after its output
        after = await samples_of(prefill_app)
        after_decode = await samples_of(decode_app)
    finally:
        await stubs.close()
        plane.close()

    assert len(tokens) == NUM_TOKENS - 1
    handoffs = "epd_prefill_embedding_handoff_seconds_count"
    assert total(after, handoffs) - total(before, handoffs) == 1
    names = {s.name for s in after}
    assert "vllm:prompt_tokens_total" in names and "vllm:generation_tokens_total" in names
    prompt_tokens = total(after, "vllm:prompt_tokens_total") - total(
        before, "vllm:prompt_tokens_total"
    )
    assert prompt_tokens >= len(prompt.token_ids)
    kv_bytes = [n for n in {s.name for s in after_decode} if n.startswith("vllm:nixl_bytes")]
    assert kv_bytes, sorted(n for n in names if n.startswith("vllm:nixl"))
    assert sum(total(after_decode, n) - total(before_decode, n) for n in kv_bytes) > 0
