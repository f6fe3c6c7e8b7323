"""Read a Prometheus text exposition the way Prometheus does, for tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def scrape(url: str) -> list[Sample]:
    """Every sample served at ``url`` (http://HOST:PORT/metrics)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The value of the one sample named ``name`` whose labels include ``labels``."""
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) == 1, f"{len(found)} samples {name}{labels}"
    return float(found[0])
