"""Build and run the scheduler server."""

from __future__ import annotations

from epd.common.metrics import new_registry
from epd.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.scheduler.config import SchedulerConfig
from epd.scheduler.core import Scheduler
from epd.scheduler.metrics import register_scheduler_metrics
from epd.scheduler.servicer import SchedulerServicer
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

SERVICE_NAME = "epd.v1.SchedulerService"


async def build_scheduler_server(
    options: ServerOptions | None = None,
    config: SchedulerConfig | None = None,
) -> tuple[EpdServer, int]:
    """A started scheduler server (SERVING at once: it has nothing to warm up)."""
    scheduler = Scheduler(config)
    servicer = SchedulerServicer(scheduler)
    binding = ServiceBinding(SERVICE_NAME, servicer, pb_grpc.add_SchedulerServiceServicer_to_server)
    registry = None
    if options is not None and options.exports_metrics:
        registry = new_registry()
        register_scheduler_metrics(scheduler, registry)
    server, port = await build_server([binding], options, registry)
    await server.mark_serving()
    return server, port
