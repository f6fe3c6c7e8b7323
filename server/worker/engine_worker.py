"""An engine served as a worker, what prefill and decode servers share: the engine's own metrics
re-exported, its drain, and the ``WorkerSpec`` of an engine (its device and model registered,
its load heartbeated)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry

from epd.common.errors import InvalidArgument, Unavailable
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


class EngineDrain:
    """The drain of a worker serving an engine (a ``Drainable``): once started, new calls are
    refused; it is settled when the engine runs nothing and, for a KV producer, holds no KV cache
    a decode worker has yet to pull (or whose lease has yet to expire)."""

    def __init__(self, engine: Engine, kind: str, *, holds_kv: bool = False) -> None:
        """``kind``: what the worker is called in the refusal ("prefill", "decode")."""
        self.engine = engine
        self.kind = kind
        self.holds_kv = holds_kv
        self.is_draining = False

    async def stop_taking_work(self) -> None:
        """Refuse new calls from now on; those in flight finish."""
        self.is_draining = True

    def is_settled(self) -> bool:
        load = self.engine.load()
        is_idle = load.num_running == 0 and load.num_waiting == 0
        return is_idle and (not self.holds_kv or load.kv_usage == 0)

    def admit(self, request_id: str, model: str) -> None:
        """Check a new call: ``Unavailable`` (reason DRAINING) once draining (the caller asks
        another); InvalidArgument for an empty request id or another model than the engine's."""
        if self.is_draining:
            raise Unavailable(
                f"{self.kind} worker for {self.engine.model_id} is draining; ask another",
                reason="DRAINING",
            )
        if not request_id:
            raise InvalidArgument("request_id must not be empty", reason="MISSING_REQUEST_ID")
        if model and model != self.engine.model_id:
            raise InvalidArgument(
                f"this worker serves {self.engine.model_id!r}, not {model!r}",
                reason="WRONG_MODEL",
            )


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
