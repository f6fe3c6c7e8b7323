"""DecodeService over gRPC: convert, call the DecodeWorker, convert back."""

from __future__ import annotations

from collections.abc import AsyncIterator

from opentelemetry import trace

from epd.common.status import Context, handle_errors
from epd.server.decode.worker import DecodeWorker
from epd.server.worker import convert
from epd.v1 import decode_service_pb2 as pb
from epd.v1 import decode_service_pb2_grpc as pb_grpc


class DecodeServicer(pb_grpc.DecodeServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``DecodeWorker``."""

    def __init__(self, worker: DecodeWorker) -> None:
        self.worker = worker

    @handle_errors
    async def Decode(
        self, request: pb.DecodeRequest, context: Context
    ) -> AsyncIterator[pb.DecodeResponse]:
        span = trace.get_current_span()
        span.set_attribute("epd.request_id", request.request_id)
        num_tokens = 0
        async for chunk in self.worker.decode(
            request.request_id,
            request.model,
            list(request.prompt_token_ids),
            convert.sampling_from_proto(request.sampling),
            request.first_token_id,
            request.kv_handle.payload,
        ):
            num_tokens += len(chunk.token_ids)
            yield pb.DecodeResponse(**convert.chunk_fields(chunk))
        span.set_attribute("epd.tokens", num_tokens)
