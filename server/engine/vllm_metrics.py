"""vLLM's own engine metrics (``vllm:*``), re-exported unchanged from an epd server's registry.

vLLM's ``PrometheusStatLogger`` (added to every AsyncLLM that logs stats) registers its metrics
with prometheus-client's process-wide registry, or, when ``PROMETHEUS_MULTIPROC_DIR`` is set,
in files that vLLM's ``get_prometheus_registry`` gathers. This collector yields the ``vllm:``
families found there at each scrape; in a process that never imported vLLM it yields nothing
(the transformers engine). Several engines in one process share that registry, so each server
there shows all of them (vLLM labels them by model name and engine index).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

PREFIX = "vllm:"


class VllmMetrics(Collector):  # type: ignore[misc]
    """The ``vllm:*`` metrics of the engines in this process."""

    def collect(self) -> Iterator[Metric]:
        prometheus = sys.modules.get("vllm.v1.metrics.prometheus")
        if prometheus is None:
            return
        for family in prometheus.get_prometheus_registry().collect():
            if family.name.startswith(PREFIX):
                yield family
