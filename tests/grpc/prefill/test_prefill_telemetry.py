"""The PrefillDecode server span marks when the prompt's images were ready for the engine and
when its first token was, once each, in that order."""

from __future__ import annotations

from pathlib import Path

import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from epd.common.channels import create_channel
from epd.common.telemetry import FIRST_TOKEN_EVENT
from epd.server.engine.base import TokenChunk
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.prefill.worker import IMAGES_RESOLVED
from epd.server.transfer.inline import InlineProducer
from epd.v1 import generation_pb2, multimodal_pb2
from epd.v1 import prefill_service_pb2 as pb
from epd.v1 import prefill_service_pb2_grpc as pb_grpc
from tests.engines import CannedEngine

THREE_TOKENS = [TokenChunk([5], ""), TokenChunk([6], ""), TokenChunk([7], "length")]


async def test_prefill_decode_marks_images_resolved_then_first_token(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await build_prefill_server(PrefillConfig(tmp_path), CannedEngine(THREE_TOKENS))
    image = multimodal_pb2.ImageInput(
        mm_hash="h",
        grid=multimodal_pb2.ImageGrid(t=1, h=2, w=2),
        embeddings=InlineProducer().put(torch.zeros(1, 8)),
    )
    request = pb.PrefillDecodeRequest(
        request_id="r1",
        model="tiny",
        prompt=generation_pb2.Prompt(token_ids=[1, 2], images=[image]),
        sampling=generation_pb2.SamplingParams(max_tokens=3),
    )
    try:
        async with create_channel(f"127.0.0.1:{app.port}") as channel:
            stub = pb_grpc.PrefillServiceStub(channel)
            tokens = [t async for r in stub.PrefillDecode(request) for t in r.token_ids]
    finally:
        await app.stop()
    assert tokens == [5, 6, 7]
    (span,) = [
        s
        for s in spans.get_finished_spans()
        if s.name.endswith("PrefillService/PrefillDecode") and s.kind is SpanKind.SERVER
    ]
    assert [event.name for event in span.events] == [IMAGES_RESOLVED, FIRST_TOKEN_EVENT]
    resolved, first = span.events
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time <= resolved.timestamp <= first.timestamp <= span.end_time
