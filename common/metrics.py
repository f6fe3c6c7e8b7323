"""Prometheus metrics: one registry per server, served in the text format on a port of its own.

Each server builds its own ``CollectorRegistry`` (``new_registry``), never the process-wide
default one, so several servers in one process (in-process tests) each export only their own
metrics. Services define their metrics next to their logic (``server/<role>/metrics.py``,
``scheduler/metrics.py``, ``server/transfer/metrics.py``) and register them there. Figures that
mirror state an object already owns (queue depth, leases held, workers by state) are read from
that object at scrape time by a ``Collector``, not kept twice.

Names follow Prometheus conventions: ``epd_`` prefix, base units in the name (``_seconds``,
``_bytes``), counters end in ``_total``. The exposition is prometheus-client's threaded WSGI
server (``/metrics`` and any other path), plain HTTP unless the server has a TLS certificate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

# Latency buckets in seconds, from a cache hit to a long answer.
LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
# Per-token times in seconds: CPU decode steps to slow shared machines.
TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Counts of small things (images per request, items per batch).
COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)


def new_registry() -> CollectorRegistry:
    """A fresh registry with this process's CPU, memory and file-descriptor figures
    (``process_*``); services add their own metrics to it."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


@dataclass
class MetricsServer:
    """A running exposition of one registry; ``close`` stops it."""

    port: int
    _httpd: WSGIServer
    _thread: threading.Thread

    def close(self) -> None:
        """Stop serving and free the port. Idempotent."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()


def start_metrics_server(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    certfile: str | None = None,
    keyfile: str | None = None,
) -> MetricsServer:
    """Serve ``registry`` on ``host:port`` (0: a free port) in a daemon thread."""
    httpd, thread = start_http_server(
        port, host.strip("[]"), registry, certfile=certfile, keyfile=keyfile
    )
    bound = int(httpd.server_port)
    logger.info("metrics on %s:%d", host, bound)
    return MetricsServer(bound, httpd, thread)


class ScrapeCollector(Collector):  # type: ignore[misc]
    """A collector whose families are built by ``collect_families`` at every scrape."""

    def __init__(
        self, collect_families: Callable[[], Iterable[GaugeMetricFamily | CounterMetricFamily]]
    ) -> None:
        self._collect_families = collect_families

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return self._collect_families()


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    """An unlabelled gauge family holding ``value``."""
    return GaugeMetricFamily(name, documentation, value=value)


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    """An unlabelled counter family holding ``value`` (``name`` without ``_total``)."""
    return CounterMetricFamily(name, documentation, value=value)


def labelled_gauge(
    name: str, documentation: str, labels: list[str], values: dict[tuple[str, ...], float]
) -> GaugeMetricFamily:
    """A gauge family with one sample per label tuple of ``values``."""
    return _with_samples(GaugeMetricFamily(name, documentation, labels=labels), values)


def labelled_counter(
    name: str, documentation: str, labels: list[str], values: dict[tuple[str, ...], float]
) -> CounterMetricFamily:
    """A counter family with one sample per label tuple of ``values``."""
    return _with_samples(CounterMetricFamily(name, documentation, labels=labels), values)


Family = TypeVar("Family", GaugeMetricFamily, CounterMetricFamily)


def _with_samples(family: Family, values: dict[tuple[str, ...], float]) -> Family:
    for label_values, value in sorted(values.items()):
        family.add_metric(list(label_values), value)
    return family
