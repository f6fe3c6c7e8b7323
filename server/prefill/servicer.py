"""PrefillService over gRPC: convert, call the PrefillWorker, convert back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import trace

from epd.server.common.errors import FailedPrecondition
from epd.server.common.status import handle_errors
from epd.server.prefill import convert
from epd.server.prefill.service import PrefillWorker
from epd.v1 import prefill_service_pb2 as pb
from epd.v1 import prefill_service_pb2_grpc as pb_grpc

Context = Any


class PrefillServicer(pb_grpc.PrefillServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``PrefillWorker``."""

    def __init__(self, worker: PrefillWorker) -> None:
        self.worker = worker

    @handle_errors
    async def Prefill(self, request: pb.PrefillRequest, context: Context) -> pb.PrefillResponse:
        raise FailedPrecondition(
            f"this worker runs in {self.worker.mode.value} mode and serves PrefillDecode; "
            "Prefill (KV handed to a decode worker) needs a worker in prefill mode",
            reason="WRONG_MODE")

    @handle_errors
    async def PrefillDecode(
        self, request: pb.PrefillDecodeRequest, context: Context
    ) -> AsyncIterator[pb.PrefillDecodeResponse]:
        span = trace.get_current_span()
        span.set_attribute("epd.request_id", request.request_id)
        span.set_attribute("epd.images", len(request.prompt.images))
        sampling = convert.sampling_from_proto(request.sampling)
        num_tokens = 0
        async for chunk in self.worker.generate(request.request_id, request.model, request.prompt,
                                                sampling):  # fmt: skip
            num_tokens += len(chunk.token_ids)
            response = pb.PrefillDecodeResponse(
                token_ids=chunk.token_ids,
                finish_reason=convert.finish_reason_to_proto(chunk.finish_reason))  # type: ignore[arg-type]
            if chunk.usage is not None:
                response.usage.CopyFrom(convert.usage_to_proto(chunk.usage))
            yield response
        span.set_attribute("epd.tokens", num_tokens)
