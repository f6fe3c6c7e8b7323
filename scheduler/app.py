"""Build and run the scheduler server."""

from __future__ import annotations

from epd.scheduler.core import Scheduler, SchedulerConfig
from epd.scheduler.servicer import SchedulerServicer
from epd.server.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

SERVICE_NAME = "epd.v1.SchedulerService"


async def build_scheduler_server(
    options: ServerOptions | None = None, config: SchedulerConfig | None = None,
) -> tuple[EpdServer, int]:  # fmt: skip
    """A started scheduler server (SERVING at once: it has nothing to warm up)."""
    servicer = SchedulerServicer(Scheduler(config))
    binding = ServiceBinding(SERVICE_NAME, servicer, pb_grpc.add_SchedulerServiceServicer_to_server)
    server, port = await build_server([binding], options)
    await server.mark_serving()
    return server, port
