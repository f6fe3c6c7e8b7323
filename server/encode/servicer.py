"""EncodeService over gRPC: convert, call the EncodeWorker, convert back."""

from __future__ import annotations

from collections.abc import AsyncIterator

from opentelemetry import trace

from epd.common.status import Context, handle_errors
from epd.server.encode.video_items import VideoSpan
from epd.server.encode.worker import EncodeWorker, MediaSource
from epd.server.media.image_settings import image_settings_of
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2


class EncodeServicer(pb_grpc.EncodeServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``EncodeWorker``."""

    def __init__(self, worker: EncodeWorker) -> None:
        self.worker = worker

    @handle_errors
    async def Encode(
        self, request: pb.EncodeRequest, context: Context
    ) -> AsyncIterator[pb.EncodeResponse]:
        span = trace.get_current_span()
        span.set_attribute("epd.request_id", request.request_id)
        span.set_attribute("epd.encoder_id", self.worker.worker_id)
        span.set_attribute("epd.items", len(request.items))
        sources = [
            MediaSource(
                item.mm_hash,
                item.url,
                item.data,
                item.pixels if item.HasField("pixels") else None,
                VideoSpan.from_proto(item.video) if item.HasField("video") else None,
                key_salt=item.key_salt,
                image_settings=image_settings_of(item.image_settings),
            )
            for item in request.items
        ]
        hits = num_bytes = largest_batch = 0
        async for result in self.worker.encode(
            sources,
            model=request.model,
            consumer_host_id=request.consumer_host_id,
            consumer_device=request.consumer_device,
            transfer_kind=request.transfer_kind,
        ):
            hits += result.cache_hit
            num_bytes += result.embeddings.byte_size
            largest_batch = max(largest_batch, result.batch_size)
            yield pb.EncodeResponse(
                item_index=result.item_index,
                mm_hash=result.mm_hash,
                embeddings=result.embeddings,
                grid=multimodal_pb2.ImageGrid(t=result.grid[0], h=result.grid[1], w=result.grid[2]),
                cache_hit=result.cache_hit,
                encoder_id=self.worker.worker_id,
                encode_seconds=result.encode_seconds,
            )
            span.set_attribute("epd.transfer_kind", result.embeddings.WhichOneof("location") or "")
        span.set_attribute("epd.cache_hits", hits)
        span.set_attribute("epd.cache_misses", len(request.items) - hits)
        span.set_attribute("epd.batch_size", largest_batch)
        span.set_attribute("epd.bytes", num_bytes)

    @handle_errors
    async def Release(self, request: pb.ReleaseRequest, context: Context) -> pb.ReleaseResponse:
        return pb.ReleaseResponse(num_released=self.worker.plane.release(request.lease_ids))
