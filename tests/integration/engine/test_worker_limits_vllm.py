"""Prefill and decode workers on vLLM at their limits, over gRPC on the session engines.

- A caller's deadline: ``PrefillDecode`` and ``Decode`` calls that outlive it end with
  DEADLINE_EXCEEDED and the engine request is aborted (nothing left running).
- The scheduler: a prefill worker (prefill mode) and a decode worker register with their roles
  and model, heartbeat the decode engine's load while a stream runs and its return to zero
  after, and leave the registry when they stop.
- Usage: a text prompt sent twice reports its length, and vLLM's prefix cache hits the second
  time (``cached_tokens``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.scheduler.app import build_scheduler_server
from epd.scheduler.config import SchedulerConfig
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.engine.base import Engine
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc

from .helpers import Stubs, prompt_tokens

pytestmark = pytest.mark.vllm
DEADLINE_S = 1.0
LONG = generation_pb2.SamplingParams(max_tokens=2000, ignore_eos=True)
# NOTE: heartbeats go every ttl/3 s; a short TTL keeps the load test quick.
SCHEDULER_TTL_S = 1.5
WAIT_S = 15.0


@pytest.fixture(scope="module")
async def stubs(tiny_model_dir, engines):
    stubs = Stubs(engines)
    stubs.aggregated = await stubs.serve(
        await build_prefill_server(PrefillConfig(tiny_model_dir), stubs.producer),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.prefill = await stubs.serve(
        await build_prefill_server(
            PrefillConfig(tiny_model_dir, mode=Role.PREFILL), stubs.producer
        ),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.decode = await stubs.serve(
        await build_decode_server(DecodeConfig(), stubs.consumer), decode_grpc.DecodeServiceStub
    )
    yield stubs
    await stubs.close()


def text_prompt(oracle, text: str) -> generation_pb2.Prompt:
    return generation_pb2.Prompt(token_ids=prompt_tokens(oracle, 0, text))


async def prefill(stubs, request_id: str, prompt, sampling) -> prefill_pb.PrefillResponse:
    return await stubs.prefill.Prefill(
        prefill_pb.PrefillRequest(
            request_id=request_id, model="tiny", prompt=prompt, sampling=sampling
        )
    )


def decode_request(
    request_id: str, prompt, sampling, first: prefill_pb.PrefillResponse
) -> decode_pb.DecodeRequest:
    return decode_pb.DecodeRequest(
        request_id=request_id,
        model="tiny",
        prompt_token_ids=prompt.token_ids,
        sampling=sampling,
        first_token_id=first.first_token_id,
        kv_handle=first.kv_handle,
    )


async def read_until_deadline(call) -> int:
    """Read ``call`` until it fails; it must fail with DEADLINE_EXCEEDED. Returns chunks read."""
    num_chunks = 0
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        while await call.read() is not grpc.aio.EOF:
            num_chunks += 1
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, caught.value.details()
    return num_chunks


def num_unfinished(engine: Engine) -> tuple[int, int]:
    """Requests running in the worker's engine wrapper, and those vLLM's AsyncLLM still has."""
    llm = engine._llm  # type: ignore[attr-defined]
    return engine.load().num_running, llm.get_num_unfinished_requests()


async def wait_idle(engine: Engine, timeout_s: float = 5.0) -> None:
    """Wait until nothing runs, in the wrapper and in vLLM (only an abort ends a long request
    that soon)."""
    deadline = time.monotonic() + timeout_s
    while any(num_unfinished(engine)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert num_unfinished(engine) == (0, 0), f"still running after {timeout_s}s"


async def test_a_prefill_decode_past_its_deadline_is_aborted(stubs, oracle) -> None:
    request = prefill_pb.PrefillDecodeRequest(
        request_id="deadline-pd",
        model="tiny",
        sampling=LONG,
        prompt=text_prompt(oracle, "count slowly to two thousand"),
    )
    call = stubs.aggregated.PrefillDecode(request, timeout=DEADLINE_S)
    assert await read_until_deadline(call) >= 1, "the engine streamed before the deadline"
    await wait_idle(stubs.producer)


async def test_a_decode_past_its_deadline_is_aborted(stubs, oracle) -> None:
    prompt = text_prompt(oracle, "recite the alphabet two thousand times")
    first = await prefill(stubs, "deadline-d", prompt, LONG)
    assert first.kv_handle.payload, "a 2000-token request goes on at a decode worker"
    call = stubs.decode.Decode(
        decode_request("deadline-d", prompt, LONG, first), timeout=DEADLINE_S
    )
    assert await read_until_deadline(call) >= 1, "the engine streamed before the deadline"
    await wait_idle(stubs.consumer)
    assert stubs.producer.load().num_running == 0


async def test_a_repeated_prompt_hits_the_prefix_cache(stubs, oracle) -> None:
    # NOTE: vLLM caches whole blocks (128 tokens on CPU): the prompt spans several.
    text = " ".join(f"item {i} is a {['red', 'green', 'blue'][i % 3]} cube;" for i in range(80))
    prompt = text_prompt(oracle, f"{text} which items are green?")
    assert len(prompt.token_ids) > 3 * 128
    sampling = generation_pb2.SamplingParams(max_tokens=4, ignore_eos=True)
    usages = []
    for request_id in ("cache-1", "cache-2"):
        request = prefill_pb.PrefillDecodeRequest(
            request_id=request_id, model="tiny", prompt=prompt, sampling=sampling
        )
        responses = [r async for r in stubs.aggregated.PrefillDecode(request)]
        usages.append(responses[-1].usage)
    first, second = usages
    assert first.prompt_tokens == second.prompt_tokens == len(prompt.token_ids)
    assert first.completion_tokens == second.completion_tokens == 4
    assert second.cached_prompt_tokens > 0, "the second request reuses the first one's KV blocks"
    assert second.cached_prompt_tokens > first.cached_prompt_tokens
    assert second.cached_prompt_tokens < len(prompt.token_ids)


Workers = dict[str, scheduler_pb.WorkerStatus]


async def list_workers(stub) -> Workers:
    reply = await stub.ListWorkers(scheduler_pb.ListWorkersRequest(), timeout=5)
    return {status.info.id: status for status in reply.workers}


async def wait_for(stub, what: str, check: Callable[[Workers], bool]) -> Workers:
    """Poll ListWorkers until ``check`` holds (up to WAIT_S); returns the listing."""
    deadline = time.monotonic() + WAIT_S
    workers = await list_workers(stub)
    while not check(workers):
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S}s: {workers}"
        await asyncio.sleep(0.1)
        workers = await list_workers(stub)
    return workers


def decode_load(workers: Workers) -> scheduler_pb.WorkerLoad | None:
    status = workers.get("d-reg")
    return status.load if status is not None else None


async def is_serving(port: int) -> bool:
    async with create_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def check_registered(stub, apps) -> None:
    workers = await wait_for(stub, "registrations", lambda w: {"p-reg", "d-reg"} <= set(w))
    prefill_worker, decode_worker = workers["p-reg"], workers["d-reg"]
    assert prefill_worker.info.role == scheduler_pb.WORKER_ROLE_PREFILL
    assert decode_worker.info.role == scheduler_pb.WORKER_ROLE_DECODE
    for status, app in zip((prefill_worker, decode_worker), apps, strict=True):
        assert status.info.model == "tiny"
        assert status.info.endpoint == f"127.0.0.1:{app.port}"
        assert status.state == scheduler_pb.WORKER_STATE_LIVE
        assert await is_serving(app.port)


async def check_decode_load(stub, stubs, oracle) -> None:
    """While a long decode streams, heartbeats carry its load; after it ends, zero."""
    prompt = text_prompt(oracle, "tell a long story about heartbeats")
    first = await prefill(stubs, "load-d", prompt, LONG)
    call = stubs.decode.Decode(decode_request("load-d", prompt, LONG, first))
    await call.read()

    def busy(workers) -> bool:
        load = decode_load(workers)
        return load is not None and load.num_in_flight + load.queue_depth >= 1

    load = decode_load(await wait_for(stub, "decode load in a heartbeat", busy))
    assert load is not None and 0 < load.kv_usage <= 1, load
    call.cancel()
    await wait_idle(stubs.consumer)

    def idle(workers) -> bool:
        load = decode_load(workers)
        return load is not None and load.num_in_flight == load.queue_depth == 0

    await wait_for(stub, "idle decode load in a heartbeat", idle)


async def test_workers_register_heartbeat_their_load_and_leave(
    tiny_model_dir, engines, oracle
) -> None:
    server, port = await build_scheduler_server(config=SchedulerConfig(ttl_s=SCHEDULER_TTL_S))
    endpoint = f"127.0.0.1:{port}"
    stubs = Stubs(engines)
    try:
        prefill_app = await build_prefill_server(
            PrefillConfig(tiny_model_dir, mode=Role.PREFILL, worker_id="p-reg", scheduler=endpoint),
            stubs.producer,
        )
        stubs.prefill = await stubs.serve(prefill_app, prefill_grpc.PrefillServiceStub)
        decode_app = await build_decode_server(
            DecodeConfig(worker_id="d-reg", scheduler=endpoint), stubs.consumer
        )
        stubs.decode = await stubs.serve(decode_app, decode_grpc.DecodeServiceStub)
        async with create_channel(endpoint) as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            await check_registered(stub, (prefill_app, decode_app))
            await check_decode_load(stub, stubs, oracle)
            await stubs.close()
            workers = await list_workers(stub)
            left = {
                worker_id: workers[worker_id].state
                for worker_id in ("p-reg", "d-reg")
                if worker_id in workers
            }
            assert set(left.values()) <= {scheduler_pb.WORKER_STATE_DRAINING}, workers
    finally:
        await stubs.close()
        await server.drain_and_stop(0)
