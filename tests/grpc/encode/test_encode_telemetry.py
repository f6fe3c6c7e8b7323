"""The Encode server span carries items, cache hits and misses, batch size, bytes, transfer kind."""

from __future__ import annotations

import io
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from PIL import Image

from epd.common.channels import create_channel
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2


async def test_span_attributes(tiny_model_dir: Path, spans: InMemorySpanExporter) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (84, 56), (1, 2, 3)).save(buffer, format="PNG")
    app = await build_encode_server(
        EncodeConfig(tiny_model_dir, model_id="tiny", transfer_kind="inline")
    )
    try:
        async with create_channel(f"127.0.0.1:{app.port}") as channel:
            stub = pb_grpc.EncodeServiceStub(channel)
            for _ in range(2):
                request = pb.EncodeRequest(
                    request_id="r1", items=[multimodal_pb2.MediaItem(data=buffer.getvalue())]
                )
                _ = [r async for r in stub.Encode(request)]
    finally:
        await app.stop()
    encodes = [
        s
        for s in spans.get_finished_spans()
        if s.name.endswith("EncodeService/Encode") and s.kind is SpanKind.SERVER
    ]
    assert len(encodes) == 2
    miss, hit = (dict(s.attributes or {}) for s in encodes)
    assert miss["epd.request_id"] == "r1" and miss["epd.items"] == 1
    assert (miss["epd.cache_hits"], miss["epd.cache_misses"], miss["epd.batch_size"]) == (0, 1, 1)
    assert (hit["epd.cache_hits"], hit["epd.cache_misses"], hit["epd.batch_size"]) == (1, 0, 0)
    assert miss["epd.bytes"] == hit["epd.bytes"] == 6 * 128 * 4
    assert miss["epd.transfer_kind"] == "inline_data"
