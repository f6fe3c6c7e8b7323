"""Prometheus metrics of a prefill worker: its own embedding hand-off times, and the engine's
metrics as vLLM exports them (KV hand-off bytes included: ``vllm:nixl_*``; a decode worker
exports those alone, ``epd.server.worker.engine_worker.register_engine_metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from epd.common.metrics import LATENCY_BUCKETS_S
from epd.server.media.loader import MediaLoader
from epd.server.media.metrics import register_media_metrics
from epd.server.transfer.metrics import register_plane_metrics
from epd.server.transfer.plane import DataPlane
from epd.server.worker.engine_worker import register_engine_metrics


class PrefillMetrics:
    """The worker's own metrics in ``registry``, plus vLLM's re-exported there and its media
    ``loader``'s and data ``plane``'s."""

    def __init__(self, registry: CollectorRegistry, loader: MediaLoader, plane: DataPlane) -> None:
        self.embedding_handoff = Histogram(
            "epd_prefill_embedding_handoff_seconds",
            "Seconds to take in one request's image inputs before the engine runs: read the "
            "embeddings from the data plane or load raw images",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        register_engine_metrics(registry)
        register_media_metrics(loader, registry)
        register_plane_metrics(plane, registry)
