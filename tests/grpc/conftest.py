"""Fixtures of the in-process gRPC tests."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epd.common.telemetry import configure_tracing


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """Finished spans of the test (the process-wide provider gets one in-memory exporter)."""
    provider = configure_tracing("epd-tests")
    assert isinstance(provider, TracerProvider)
    exporter = _memory_exporter(provider)
    exporter.clear()
    return exporter


_MEMORY: list[InMemorySpanExporter] = []


def _memory_exporter(provider: TracerProvider) -> InMemorySpanExporter:
    if not _MEMORY:
        _MEMORY.append(InMemorySpanExporter())
        provider.add_span_processor(SimpleSpanProcessor(_MEMORY[0]))
    return _MEMORY[0]
