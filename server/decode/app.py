"""Assemble a decode server: KV-consumer engine, servicer, registration."""

from __future__ import annotations

from dataclasses import dataclass

from epd.common.metrics import new_registry
from epd.common.roles import Role
from epd.common.server import ServerOptions, ServiceBinding
from epd.server.decode.servicer import DecodeServicer
from epd.server.decode.worker import DecodeWorker
from epd.server.engine.base import DEFAULT_MAX_PENDING, Engine
from epd.server.transfer.plane import default_host_id
from epd.server.worker.engine_worker import engine_worker_spec, register_engine_metrics
from epd.server.worker.serve_worker import WorkerApp, serve_worker
from epd.v1 import decode_service_pb2_grpc as pb_grpc

SERVICE_NAME = "epd.v1.DecodeService"


@dataclass
class DecodeConfig:
    """Everything a decode server needs besides its engine and network options; the defaults of
    ``epd decode``'s flags. ``capacity``: requests the scheduler may place on it at once
    (``--max-pending``, the engine's admission limit too)."""

    worker_id: str = ""
    weight: float = 1.0
    capacity: int = DEFAULT_MAX_PENDING
    scheduler: str | None = None
    host_id: str = ""  # empty: plane.default_host_id()


DecodeApp = WorkerApp[DecodeWorker]
"""A running decode server (``stop`` leaves the engine to the caller)."""


async def build_decode_server(
    config: DecodeConfig, engine: Engine, options: ServerOptions | None = None
) -> DecodeApp:
    """Serve ``engine`` (a started KV consumer) and register with the scheduler (if any).
    Draining, the worker refuses new decodes and the server stops once the engine runs none."""
    options = options or ServerOptions()
    worker = DecodeWorker(engine)
    binding = ServiceBinding(
        SERVICE_NAME, DecodeServicer(worker), pb_grpc.add_DecodeServiceServicer_to_server
    )
    registry = None
    if options.exports_metrics:
        registry = new_registry()
        register_engine_metrics(registry)
    host_id = config.host_id or default_host_id()
    spec = engine_worker_spec(
        Role.DECODE,
        worker,
        binding,
        engine,
        config,
        host_id=host_id,
        registry=registry,
        drains=worker.drain,
    )
    return await serve_worker(spec, options)
