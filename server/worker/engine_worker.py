"""An engine served as a worker, what prefill and decode servers share: the engine's own metrics
re-exported, and the ``WorkerSpec`` of an engine (its device and model registered, its load
heartbeated)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry

from epd.common.roles import Role
from epd.common.server import ServiceBinding
from epd.server.engine.base import Engine
from epd.server.engine.vllm_metrics import VllmMetrics
from epd.server.worker.registration import LoadFn
from epd.server.worker.serve_worker import Close, Drainable, WorkerSpec
from epd.v1 import scheduler_service_pb2 as scheduler_pb

W = TypeVar("W")


class EngineWorkerConfig(Protocol):
    """The registration settings prefill and decode configs share."""

    worker_id: str
    weight: float
    capacity: int
    scheduler: str | None


def register_engine_metrics(registry: CollectorRegistry) -> None:
    """Re-export the engine's own metrics (vLLM's) from ``registry``."""
    registry.register(VllmMetrics())


def engine_load(engine: Engine) -> LoadFn:
    """The load an engine worker heartbeats: the engine's queue, running requests, KV usage."""

    def load() -> scheduler_pb.WorkerLoad:
        engine_load = engine.load()
        return scheduler_pb.WorkerLoad(
            queue_depth=engine_load.num_waiting,
            num_in_flight=engine_load.num_running,
            kv_usage=engine_load.kv_usage,
        )

    return load


def engine_worker_spec(
    role: Role,
    worker: W,
    binding: ServiceBinding,
    engine: Engine,
    config: EngineWorkerConfig,
    *,
    host_id: str,
    registry: CollectorRegistry | None = None,
    drains: Drainable | None = None,
    close: Close | None = None,
) -> WorkerSpec[W]:
    """The ``WorkerSpec`` of ``worker`` serving ``engine`` (already started) as ``role``."""
    info = scheduler_pb.WorkerInfo(
        device=engine.device,
        weight=config.weight,
        capacity=config.capacity,
        model=engine.model_id,
        embeddings_device=engine.embeddings_device,
    )
    return WorkerSpec(
        role,
        worker,
        binding,
        info,
        host_id,
        engine_load(engine),
        scheduler=config.scheduler,
        requested_id=config.worker_id,
        registry=registry,
        drains=drains,
        close=close,
    )
