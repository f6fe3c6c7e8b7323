"""Prometheus metrics of an encoder: its queue, batches, load, embedding cache and store.

Batch sizes and durations are observed as each batch ends (the batcher's ``on_batch``), and with
them the encoder's load: its busy fraction (tower seconds per second over ``BUSY_WINDOW_S``) and
its cost per image and per vision token (exponentially weighted over batches). The queue (in
images and in vision tokens, the batcher weighing each image by the model's token count), the
cache and the counters the batcher and cache already keep are read at every scrape.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

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
from epd.server.encode.vision import Prepared
from epd.server.encode.worker import EncodeWorker
from epd.server.media.grid import ImageGridder
from epd.server.media.metrics import register_media_metrics
from epd.server.store.base import EmbeddingStore, Lookup, Publish
from epd.server.transfer.metrics import register_plane_metrics

# The busy fraction is the tower's seconds in batches that ended this long ago at most.
BUSY_WINDOW_S = 10.0
# Weight of the latest batch in the per-image and per-token costs.
COST_ALPHA = 0.3


class BusyMeter:
    """Seconds spent per second over the last ``window_s``, from the durations of the batches
    that ended within it, and in all."""

    def __init__(
        self, window_s: float = BUSY_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ):
        self.window_s = window_s
        self.total_s = 0.0
        self._clock = clock
        self._recent: deque[tuple[float, float]] = deque()

    def add(self, seconds: float) -> None:
        """A batch of ``seconds`` ended now."""
        self.total_s += seconds
        self._recent.append((self._clock(), seconds))

    def ratio(self) -> float:
        """The busy fraction now, in [0, 1]."""
        horizon = self._clock() - self.window_s
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        return min(1.0, sum(seconds for _, seconds in self._recent) / self.window_s)


def _smoothed(previous: float | None, sample: float) -> float:
    return sample if previous is None else COST_ALPHA * sample + (1 - COST_ALPHA) * previous


class EncodeMetrics:
    """The encoder's metrics in ``registry``, with its media loader's and data plane's;
    ``observe_batch`` is the batcher's observer, and the batcher weighs each image by its
    vision tokens (``worker.gridder``'s count)."""

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
        self.busy = BusyMeter()
        self.image_cost_s: float | None = None
        self.token_cost_s: float | None = None
        registry.register(ScrapeCollector(self._families))
        register_media_metrics(worker.loader, registry)
        register_plane_metrics(worker.plane, registry)
        worker.batcher.on_batch = self.observe_batch
        if worker.gridder is not None:
            worker.batcher.weigh = _token_counter(worker.gridder)

    def observe_batch(self, num_items: int, seconds: float) -> None:
        """Record one batch that succeeded."""
        self.batch_size.observe(num_items)
        self.batch_seconds.observe(seconds)
        self.busy.add(seconds)
        self.image_cost_s = _smoothed(self.image_cost_s, seconds / num_items)
        if num_tokens := self._worker.batcher.stats.batch_weight:
            self.token_cost_s = _smoothed(self.token_cost_s, seconds / num_tokens)

    def _load_families(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        batcher = self._worker.batcher
        if self._worker.gridder is not None:
            yield gauge(
                "epd_encode_queue_image_tokens",
                "Vision tokens of the images waiting for a batch",
                batcher.queued_weight,
            )
        yield gauge(
            "epd_encode_busy_ratio",
            f"Vision-tower seconds per second over the last {BUSY_WINDOW_S:g} s (batches that "
            "ended in it): 1 is an encoder that never rests",
            self.busy.ratio(),
        )
        yield counter(
            "epd_encode_tower_seconds", "Seconds the vision tower ran batches", self.busy.total_s
        )
        if self.image_cost_s is not None:
            yield gauge(
                "epd_encode_image_cost_seconds",
                "Tower seconds per image, exponentially weighted over the latest batches",
                self.image_cost_s,
            )
        if self.token_cost_s is not None:
            yield gauge(
                "epd_encode_image_token_cost_seconds",
                "Tower seconds per vision token, exponentially weighted over the latest batches",
                self.token_cost_s,
            )

    def _families(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        batcher, cache = self._worker.batcher, self._worker.cache
        yield gauge("epd_encode_queue_depth", "Images waiting for a batch", batcher.queue_depth)
        yield from self._load_families()
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


def _token_counter(gridder: ImageGridder) -> Callable[[Prepared], int]:
    """An image's vision tokens, from the grid it was prepared with."""

    def num_tokens(prepared: Prepared) -> int:
        t, h, w = (int(n) for n in prepared.grid.reshape(-1)[:3].tolist())
        return gridder.num_tokens((t, h, w))

    return num_tokens
