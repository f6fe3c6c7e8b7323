"""Prometheus metrics of a media loader (route and encoders), read at every scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from epd.common.metrics import ScrapeCollector, labelled_counter
from epd.server.media.loader import MediaLoader


def register_media_metrics(loader: MediaLoader, registry: CollectorRegistry) -> None:
    """Export ``loader``'s refusals by reason into ``registry``."""
    registry.register(ScrapeCollector(lambda: _families(loader)))


def _families(loader: MediaLoader) -> Iterator[CounterMetricFamily]:
    yield labelled_counter(
        "epd_media_refusals",
        "Images refused while loading, by error reason (e.g. PRIVATE_ADDRESS, IMAGE_TOO_LARGE, "
        "BAD_IMAGE)",
        ["reason"],
        {(reason,): count for reason, count in dict(loader.num_refused).items()},
    )
