"""Prefill and decode workers register the device their engine runs on (they said "cpu" always),
and the device it takes image embeddings on (vLLM: host memory; transformers: its device)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from epd.common.channels import create_channel
from epd.common.roles import Role
from epd.common.server import ServerOptions
from epd.scheduler.app import build_scheduler_server
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.engine.vllm_engine import VllmEngine
from epd.server.engine.vllm_options import VllmOptions
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc
from tests.engines import QWEN_LAYOUT as LAYOUT


def engine(device: str, kv_role: str) -> VllmEngine:
    """A VllmEngine around a stand-in AsyncLLM that is never called."""
    llm = SimpleNamespace(errored=False, shutdown=lambda timeout=None: None)
    return VllmEngine(llm, "tiny", LAYOUT, VllmOptions(device=device, kv_role=kv_role))


async def registered_devices(endpoint: str, num_workers: int) -> dict[str, tuple[str, str]]:
    """Each worker's (device, embeddings_device), once ``num_workers`` are registered."""
    async with create_channel(endpoint) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        for _ in range(200):
            reply = await stub.ListWorkers(pb.ListWorkersRequest(), wait_for_ready=True, timeout=10)
            if len(reply.workers) == num_workers:
                return {
                    worker.info.id: (worker.info.device, worker.info.embeddings_device)
                    for worker in reply.workers
                }
            await asyncio.sleep(0.05)
    raise AssertionError(f"{num_workers} workers never registered")


async def test_workers_register_their_engines_device_and_embeddings_device(
    tiny_model_dir: Path,
) -> None:
    scheduler, port = await build_scheduler_server(ServerOptions(port=0))
    endpoint = f"127.0.0.1:{port}"
    prefill = await build_prefill_server(
        PrefillConfig(tiny_model_dir, Role.PREFILL, "p-gpu", scheduler=endpoint, hands_off_kv=True),
        engine("cuda:0", "kv_producer"),
    )
    decode = await build_decode_server(
        DecodeConfig("d-gpu", scheduler=endpoint), engine("cuda:1", "kv_consumer")
    )
    cpu = await build_prefill_server(
        PrefillConfig(tiny_model_dir, worker_id="pd-cpu", scheduler=endpoint),
        engine("cpu", "kv_both"),
    )
    transformers = await TransformersEngine.start(tiny_model_dir, model_id="tiny")
    in_process = await build_prefill_server(
        PrefillConfig(tiny_model_dir, worker_id="pd-transformers", scheduler=endpoint),
        transformers,
    )
    try:
        devices = await registered_devices(endpoint, 4)
        assert devices == {
            "p-gpu": ("cuda:0", "cpu"),
            "d-gpu": ("cuda:1", "cpu"),
            "pd-cpu": ("cpu", "cpu"),
            "pd-transformers": ("cpu", "cpu"),
        }
        assert in_process.worker.images.device == "cpu"
    finally:
        for app in (prefill, decode, cpu, in_process):
            await app.stop()
        await transformers.close()
        await scheduler.drain_and_stop(0)
