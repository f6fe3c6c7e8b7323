"""Prometheus metrics of an encoder: its queue, batches, embedding cache and store.

Batch sizes and durations are observed as each batch ends (the batcher's ``on_batch``); the
queue, the cache and the counters the batcher and cache already keep are read at every scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from epd.common.metrics import (
    COUNT_BUCKETS,
    LATENCY_BUCKETS_S,
    ScrapeCollector,
    counter,
    gauge,
    labelled_counter,
)
from epd.server.encode.worker import EncodeWorker
from epd.server.store.base import EmbeddingStore, Lookup, Publish


class EncodeMetrics:
    """The encoder's metrics in ``registry``; ``observe_batch`` is the batcher's observer."""

    def __init__(self, worker: EncodeWorker, registry: CollectorRegistry) -> None:
        self.batch_size = Histogram(
            "epd_encode_batch_size",
            "Images per vision-tower call",
            buckets=COUNT_BUCKETS[1:],
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "epd_encode_batch_duration_seconds",
            "Seconds one vision-tower call took (the whole batch)",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self._worker = worker
        registry.register(ScrapeCollector(self._families))
        worker.batcher.on_batch = self.observe_batch

    def observe_batch(self, num_items: int, seconds: float) -> None:
        """Record one batch that succeeded."""
        self.batch_size.observe(num_items)
        self.batch_seconds.observe(seconds)

    def _families(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        batcher, cache = self._worker.batcher, self._worker.cache
        yield gauge("epd_encode_queue_depth", "Images waiting for a batch", batcher.queue_depth)
        yield gauge(
            "epd_encode_batch_running_images",
            "Images in the batch running now",
            batcher.num_running,
        )
        yield gauge(
            "epd_encode_items_in_flight",
            "Items of Encode calls being answered (queued, encoding or handed over)",
            self._worker.num_in_flight,
        )
        yield counter(
            "epd_encode_images", "Images run through the vision tower", batcher.stats.num_items
        )
        yield counter(
            "epd_encode_failed_batches",
            "Batches of several images that failed and were run again one image at a time",
            batcher.stats.num_failed_batches,
        )
        yield counter("epd_encode_cache_hits", "Embedding cache lookups that hit", cache.num_hits)
        yield counter(
            "epd_encode_cache_misses", "Embedding cache lookups that missed", cache.num_misses
        )
        yield counter(
            "epd_encode_cache_evictions",
            "Embeddings evicted from the cache to stay within its budget",
            cache.num_evictions,
        )
        yield gauge("epd_encode_cache_bytes", "Bytes of embeddings cached now", cache.num_bytes)
        yield gauge("epd_encode_cache_capacity_bytes", "Budget of the cache", cache.max_bytes)
        yield gauge("epd_encode_cache_entries", "Images whose embeddings are cached", len(cache))
        if self._worker.store.is_enabled:
            yield from _store_families(self._worker.store)


def _store_families(store: EmbeddingStore) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    lookups, publishes = store.counts.lookups, store.counts.publishes
    yield labelled_counter(
        "epd_encode_store_lookups",
        "Embedding store lookups after a cache miss, by outcome: hit, miss, corrupt (refused by "
        "its checks), error, timeout, unavailable (not connected or every reader busy)",
        ["outcome"],
        {(outcome.value,): lookups[outcome] for outcome in Lookup},
    )
    yield labelled_counter(
        "epd_encode_store_publishes",
        "Encoded images published to the embedding store, by outcome: stored, dropped (queue "
        "full), error (refused or failed, store full included), unavailable (not connected)",
        ["outcome"],
        {(outcome.value,): publishes[outcome] for outcome in Publish},
    )
    yield gauge(
        "epd_encode_store_publish_queue", "Images waiting to be published", store.num_queued
    )
