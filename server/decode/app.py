"""Assemble a decode server: KV-consumer engine, servicer, registration."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from epd.common.metrics import new_registry
from epd.common.roles import Role, role_to_proto
from epd.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.server.decode.servicer import DecodeServicer
from epd.server.decode.worker import DecodeWorker
from epd.server.engine.base import DEFAULT_MAX_PENDING, Engine
from epd.server.transfer.plane import default_host_id
from epd.server.worker.engine_worker import register_and_serve, register_engine_metrics
from epd.server.worker.registration import WorkerRegistration
from epd.v1 import decode_service_pb2_grpc as pb_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb

SERVICE_NAME = "epd.v1.DecodeService"
logger = logging.getLogger(__name__)


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


@dataclass
class DecodeApp:
    """A running decode server."""

    server: EpdServer
    port: int
    worker: DecodeWorker
    registration: WorkerRegistration

    async def stop(self, grace: float | None = 0) -> None:
        """Drain and stop the server (the engine is the caller's to close)."""
        await self.server.drain_and_stop(grace)


async def build_decode_server(
    config: DecodeConfig, engine: Engine, options: ServerOptions | None = None
) -> DecodeApp:
    """Serve ``engine`` (a started KV consumer) and register with the scheduler (if any)."""
    options = options or ServerOptions()
    worker = DecodeWorker(engine)
    binding = ServiceBinding(
        SERVICE_NAME, DecodeServicer(worker), pb_grpc.add_DecodeServiceServicer_to_server
    )
    registry = None
    if options.exports_metrics:
        registry = new_registry()
        register_engine_metrics(registry)
    server, port = await build_server([binding], options, registry)
    host_id = config.host_id or default_host_id()
    info = scheduler_pb.WorkerInfo(
        id=config.worker_id or f"decode-{host_id}-{port}",
        role=role_to_proto(Role.DECODE),
        endpoint=options.advertised_endpoint(port, config.scheduler),
        device=engine.device,
        weight=config.weight,
        capacity=config.capacity,
        host_id=host_id,
        model=engine.model_id,
        embeddings_device=engine.embeddings_device,
    )
    registration = await register_and_serve(server, info, engine, config.scheduler, options)
    logger.info("decode worker %s serving %s on %s", info.id, engine.model_id, info.endpoint)
    return DecodeApp(server, port, worker, registration)
