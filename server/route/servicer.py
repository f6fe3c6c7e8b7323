"""RouteService over gRPC: the public entry."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from epd.server.common.status import from_rpc_error, handle_errors
from epd.server.route.service import RouteWorker
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
ROLE_NAMES = {value: name.removeprefix("WORKER_ROLE_").lower()
              for name, value in scheduler_pb.WorkerRole.items()}  # fmt: skip


class RouteServicer(pb_grpc.RouteServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``RouteWorker``; deadlines propagate to every hop."""

    def __init__(self, worker: RouteWorker) -> None:
        self.worker = worker

    @handle_errors
    async def Generate(self, request: pb.GenerateRequest,
                       context: Context) -> AsyncIterator[pb.GenerateResponse]:  # fmt: skip
        remaining = context.time_remaining()
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        request_id = request.request_id
        async for chunk in self.worker.generate(request, timeout_s=remaining):
            response = pb.GenerateResponse(
                request_id=request_id,
                text=chunk.text,
                token_ids=chunk.token_ids,
                finish_reason=chunk.finish_reason,  # type: ignore[arg-type]
            )
            if chunk.usage is not None:
                response.usage.CopyFrom(chunk.usage)
            yield response

    @handle_errors
    async def ListModels(self, request: pb.ListModelsRequest,
                         context: Context) -> pb.ListModelsResponse:  # fmt: skip
        try:
            listing = await self.worker.peers.scheduler.ListWorkers(
                scheduler_pb.ListWorkersRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None  # NOTE: the scheduler's status, not INTERNAL
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for worker in listing.workers:
            counts[worker.info.model][ROLE_NAMES.get(worker.info.role, "unknown")] += 1
        return pb.ListModelsResponse(
            models=[
                pb.ModelCard(id=model, worker_counts=dict(roles))
                for model, roles in sorted(counts.items())
            ]
        )
