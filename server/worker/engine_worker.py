"""An engine served as a worker, what prefill and decode servers share: the engine's own metrics
re-exported, and registration with the scheduler heartbeating the engine's load."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from epd.common.server import EpdServer, ServerOptions
from epd.server.engine.base import Engine
from epd.server.engine.vllm_metrics import VllmMetrics
from epd.server.worker.registration import WorkerRegistration, start_registration
from epd.v1 import scheduler_service_pb2 as scheduler_pb


def register_engine_metrics(registry: CollectorRegistry) -> None:
    """Re-export the engine's own metrics (vLLM's) from ``registry``."""
    registry.register(VllmMetrics())


async def register_and_serve(
    server: EpdServer,
    info: scheduler_pb.WorkerInfo,
    engine: Engine,
    scheduler: str | None,
    options: ServerOptions,
) -> WorkerRegistration:
    """Register ``info`` (heartbeating the engine's load), then mark the server SERVING."""

    def load() -> scheduler_pb.WorkerLoad:
        engine_load = engine.load()
        return scheduler_pb.WorkerLoad(
            queue_depth=engine_load.num_waiting,
            num_in_flight=engine_load.num_running,
            kv_usage=engine_load.kv_usage,
        )

    registration = await start_registration(server, info, load, scheduler, options)
    await server.mark_serving()
    return registration
