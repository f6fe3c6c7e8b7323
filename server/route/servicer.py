"""RouteService over gRPC: the public entry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from epd.common.status import handle_errors
from epd.server.route.request_ids import ensure_request_id
from epd.server.route.worker import Router
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class RouteServicer(pb_grpc.RouteServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``Router``; deadlines propagate to every hop."""

    def __init__(self, router: Router) -> None:
        self.router = router

    @handle_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        request_id = ensure_request_id(request)
        async for chunk in self.router.generate(request, timeout_s=context.time_remaining()):
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
    async def ListModels(
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ListModelsResponse:
        models = await self.router.list_models()
        cards = [pb.ModelCard(id=model, worker_counts=roles) for model, roles in models.items()]
        return pb.ListModelsResponse(models=cards)
