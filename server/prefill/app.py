"""Assemble a prefill server: engine, data plane consumer, registration."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from epd.common.metrics import new_registry
from epd.common.roles import PREFILL_MODES, Role, role_to_proto
from epd.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.server.engine.base import DEFAULT_MAX_PENDING, Engine
from epd.server.media.hashing import processor_fingerprint
from epd.server.media.loader import MediaLoader
from epd.server.media.metrics import register_media_metrics
from epd.server.media.policy import MediaPolicy
from epd.server.prefill.metrics import PrefillMetrics
from epd.server.prefill.servicer import PrefillServicer
from epd.server.prefill.worker import PrefillWorker
from epd.server.transfer.metrics import register_plane_metrics
from epd.server.transfer.options import TransferOptions
from epd.server.transfer.plane import DataPlane
from epd.server.worker.engine_worker import register_and_serve
from epd.server.worker.registration import WorkerRegistration
from epd.v1 import prefill_service_pb2_grpc as pb_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb

SERVICE_NAME = "epd.v1.PrefillService"
logger = logging.getLogger(__name__)


@dataclass
class PrefillConfig:
    """Everything a prefill server needs besides its engine and network options; the defaults of
    ``epd prefill``'s flags. ``mode``: the role it serves and registers as, one of
    ``PREFILL_MODES`` (ValueError for another). ``capacity``: requests the scheduler may place
    on it at once (``--max-pending``, the engine's admission limit too)."""

    model_dir: Path
    mode: Role = Role.PREFILL_DECODE
    worker_id: str = ""
    weight: float = 1.0
    capacity: int = DEFAULT_MAX_PENDING
    scheduler: str | None = None
    media: MediaPolicy = field(default_factory=MediaPolicy)
    hands_off_kv: bool = False
    transfer: TransferOptions = field(default_factory=TransferOptions)

    def __post_init__(self) -> None:
        if self.mode not in PREFILL_MODES:
            raise ValueError(f"a prefill worker cannot serve the {self.mode.label} role")
        if self.capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {self.capacity}")


@dataclass
class PrefillApp:
    """A running prefill server."""

    server: EpdServer
    port: int
    worker: PrefillWorker
    registration: WorkerRegistration

    async def stop(self, grace: float | None = 0) -> None:
        """Drain and stop the server (the engine is the caller's to close)."""
        await self.server.drain_and_stop(grace)
        self.worker.plane.close()


async def build_prefill_server(
    config: PrefillConfig, engine: Engine, options: ServerOptions | None = None
) -> PrefillApp:
    """Serve ``engine`` (already started) and register with the scheduler (if any)."""
    options = options or ServerOptions()
    plane = DataPlane.from_options(config.transfer)
    # NOTE: the reaper also forgets kept mappings of encoders' segments that their encoder
    # unlinked (an encoder that stopped), which would pin that memory in this process.
    plane.start_reaper()
    loader = MediaLoader(
        config.media,
        model_id=engine.model_id,
        processor_fingerprint=processor_fingerprint(config.model_dir),
    )
    registry = new_registry() if options.exports_metrics else None
    metrics = None
    if registry is not None:
        metrics = PrefillMetrics(registry)
        register_plane_metrics(plane, registry)
        register_media_metrics(loader, registry)
    worker = PrefillWorker(
        engine, plane, config.mode, loader, hands_off_kv=config.hands_off_kv, metrics=metrics
    )
    binding = ServiceBinding(
        SERVICE_NAME, PrefillServicer(worker), pb_grpc.add_PrefillServiceServicer_to_server
    )
    server, port = await build_server([binding], options, registry)
    if worker.hands_off_kv:
        # NOTE: a decode worker pulls the KV after Prefill returned, from the engine's memory.
        server.add_drain_callback(worker.stop_taking_work)
        server.add_drain_hold(worker.is_settled)
    info = scheduler_pb.WorkerInfo(
        id=config.worker_id or f"{config.mode.label}-{plane.host_id}-{port}",
        role=role_to_proto(config.mode),
        endpoint=options.advertised_endpoint(port, config.scheduler),
        device=engine.device,
        weight=config.weight,
        capacity=config.capacity,
        host_id=plane.host_id,
        model=engine.model_id,
        embeddings_device=engine.embeddings_device,
    )
    registration = await register_and_serve(server, info, engine, config.scheduler, options)
    logger.info(
        "prefill worker %s (%s) serving %s on %s",
        info.id,
        config.mode.label,
        engine.model_id,
        info.endpoint,
    )
    return PrefillApp(server, port, worker, registration)
