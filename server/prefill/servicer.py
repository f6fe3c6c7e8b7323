"""PrefillService over gRPC: convert, call the PrefillWorker, convert back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import trace

from epd.common.status import Context, handle_errors
from epd.common.telemetry import FIRST_TOKEN_EVENT
from epd.server.prefill.worker import PrefillWorker
from epd.server.worker import convert
from epd.v1 import prefill_service_pb2 as pb
from epd.v1 import prefill_service_pb2_grpc as pb_grpc


def _annotate(request_id: str, num_images: int) -> Any:
    span = trace.get_current_span()
    span.set_attribute("epd.request_id", request_id)
    span.set_attribute("epd.images", num_images)
    return span


class PrefillServicer(pb_grpc.PrefillServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``PrefillWorker``."""

    def __init__(self, worker: PrefillWorker) -> None:
        self.worker = worker

    @handle_errors
    async def Prefill(self, request: pb.PrefillRequest, context: Context) -> pb.PrefillResponse:
        _annotate(request.request_id, len(request.prompt.images))
        sampling = convert.sampling_from_proto(request.sampling)
        result = await self.worker.prefill(
            request.request_id, request.model, request.prompt, sampling
        )
        return pb.PrefillResponse(**convert.prefill_fields(result))

    @handle_errors
    async def PrefillDecode(
        self, request: pb.PrefillDecodeRequest, context: Context
    ) -> AsyncIterator[pb.PrefillDecodeResponse]:
        span = _annotate(request.request_id, len(request.prompt.images))
        sampling = convert.sampling_from_proto(request.sampling)
        num_tokens = 0
        async for chunk in self.worker.generate(
            request.request_id, request.model, request.prompt, sampling
        ):
            if chunk.token_ids and not num_tokens:
                span.add_event(FIRST_TOKEN_EVENT)
            num_tokens += len(chunk.token_ids)
            yield pb.PrefillDecodeResponse(**convert.chunk_fields(chunk))
        span.set_attribute("epd.tokens", num_tokens)
