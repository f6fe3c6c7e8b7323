"""Assemble a prefill server: engine, data plane consumer, registration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from epd.common.flags import flag
from epd.common.metrics import new_registry
from epd.common.roles import PREFILL_MODES, Role
from epd.common.server import ServerOptions, ServiceBinding
from epd.server.engine.base import DEFAULT_MAX_PENDING, Engine
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_planner import VideoPlanner
from epd.server.prefill.metrics import PrefillMetrics
from epd.server.prefill.servicer import PrefillServicer
from epd.server.prefill.worker import PrefillWorker
from epd.server.transfer.options import TransferOptions
from epd.server.transfer.plane import DataPlane
from epd.server.worker.engine_worker import engine_worker_spec
from epd.server.worker.serve_worker import WorkerApp, serve_worker
from epd.v1 import prefill_service_pb2_grpc as pb_grpc

SERVICE_NAME = "epd.v1.PrefillService"


@dataclass
class PrefillConfig:
    """Everything a prefill server needs besides its engine and network options; the defaults of
    ``epd prefill``'s flags. ``mode``: the role it serves and registers as, one of
    ``PREFILL_MODES`` (ValueError for another). ``capacity``: requests the scheduler may place
    on it at once (``--max-pending``, the engine's admission limit too)."""

    model_dir: Path
    mode: Role = field(
        default=Role.PREFILL_DECODE,
        metadata=flag(
            "prefill: first token + KV handle for a decode worker; prefill_decode: aggregated "
            "prefill + decode from image embeddings; encode_prefill: also takes raw images and "
            "encodes them itself",
            choices=tuple(PREFILL_MODES),
        ),
    )
    worker_id: str = ""
    weight: float = 1.0
    capacity: int = DEFAULT_MAX_PENDING
    scheduler: str | None = None
    media: MediaPolicy = field(default_factory=MediaPolicy)
    hands_off_kv: bool = field(
        default=False,
        metadata=flag(
            "encode_prefill: also serve Prefill, handing KV to decode workers (EP/D); implied "
            "by --mode prefill",
            name="kv-transfer",
        ),
    )
    transfer: TransferOptions = field(default_factory=TransferOptions)

    def __post_init__(self) -> None:
        if self.mode not in PREFILL_MODES:
            raise ValueError(f"a prefill worker cannot serve the {self.mode.label} role")
        if self.capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {self.capacity}")


PrefillApp = WorkerApp[PrefillWorker]
"""A running prefill server (``stop`` closes its data plane, leaves the engine to the caller)."""


async def build_prefill_server(
    config: PrefillConfig, engine: Engine, options: ServerOptions | None = None
) -> PrefillApp:
    """Serve ``engine`` (already started) and register with the scheduler (if any)."""
    options = options or ServerOptions()
    plane = DataPlane.from_options(config.transfer)
    # NOTE: the reaper also forgets kept mappings of encoders' segments that their encoder
    # unlinked (an encoder that stopped), which would pin that memory in this process.
    plane.start_reaper()
    loader = MediaLoader.for_model(config.media, config.model_dir, model_id=engine.model_id)
    registry = new_registry() if options.exports_metrics else None
    metrics = None if registry is None else PrefillMetrics(registry, loader, plane)
    videos = None
    if config.mode is Role.ENCODE_PREFILL:
        # NOTE: decodes a raw video only where the route's frames cannot be read (another host)
        planner = VideoPlanner(config.model_dir, engine.model_id)
        videos = VideoLoader(planner, config.media, cache_items=2)
    worker = PrefillWorker(
        engine,
        plane,
        config.mode,
        loader,
        hands_off_kv=config.hands_off_kv,
        metrics=metrics,
        videos=videos,
    )
    binding = ServiceBinding(
        SERVICE_NAME, PrefillServicer(worker), pb_grpc.add_PrefillServiceServicer_to_server
    )
    spec = engine_worker_spec(
        config.mode,
        worker,
        binding,
        engine,
        config,
        host_id=plane.host_id,
        registry=registry,
        # NOTE: a decode worker pulls the KV after Prefill returned, from the engine's memory.
        drains=worker.drain if worker.hands_off_kv else None,
        close=plane.close,
    )
    return await serve_worker(spec, options)
