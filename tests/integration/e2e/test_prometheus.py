"""A real Prometheus scrapes a running ``epd up`` (E/PD on the transformers engine): after a known
set of requests (one image, repeated), PromQL over Prometheus's HTTP API counts exactly them, a
cache hit for each repeat, and no lease outstanding once idle. The Grafana dashboard queries only
metrics the services export."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from epd.client import EpdClient, user
from tests.integration.e2e.launcher import running_stack
from tests.integration.e2e.prometheus import (
    prometheus_binary,
    query,
    query_until,
    running_prometheus,
)
from tests.pictures import picture, png

DASHBOARD = Path(__file__).parents[3] / "deploy" / "grafana" / "epd.json"
NUM_REQUESTS = 3


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    prometheus_binary()  # NOTE: install (or skip) before the deployment starts
    work_dir = tmp_path_factory.mktemp("prometheus")
    with (
        running_stack(
            tiny_model_dir,
            work_dir,
            "--topology",
            "e-pd",
            "--engine",
            "transformers",
            timeout_s=240,
        ) as running,
        running_prometheus(running.endpoints["metrics"], work_dir) as base,
    ):
        yield running, base


def test_promql_counts_the_requests_sent(stack) -> None:
    running, prometheus = stack
    jobs = ["encode0", "prefill", "route", "scheduler"]
    assert sorted(running.endpoints["metrics"]) == jobs

    def settles(promql: str, expected: float) -> None:
        assert query_until(prometheus, promql, expected) == expected, promql

    settles("count(up == 1)", len(jobs))
    image = png(picture(23))
    with EpdClient(running.route, timeout_s=120) as client:
        answers = [
            client.generate([user("What is this?", image=image)], max_tokens=4)
            for _ in range(NUM_REQUESTS)
        ]
    settles('sum(epd_route_requests_total{outcome="ok",code="OK"})', NUM_REQUESTS)
    settles("sum(epd_route_requests_total)", NUM_REQUESTS)
    settles("sum(epd_route_generated_tokens_total)", sum(len(a.token_ids) for a in answers))
    settles("sum(epd_route_time_to_first_token_seconds_count)", NUM_REQUESTS)
    settles("sum(epd_route_images_per_request_sum)", NUM_REQUESTS)
    settles("sum(epd_encode_images_total)", 1)
    settles("sum(epd_encode_cache_misses_total)", 1)
    settles("sum(epd_encode_cache_hits_total)", NUM_REQUESTS - 1)
    settles("sum(epd_scheduler_assigned_items_total)", NUM_REQUESTS)
    settles('sum(epd_scheduler_workers{state="live"})', 2)
    settles("sum(epd_transfer_leases_outstanding)", 0)
    settles("sum(epd_transfer_leases_expired_total)", 0)
    settles("sum(epd_route_requests_in_flight)", 0)
    embeddings = 'sum(epd_transfer_bytes_total{job="encode0",direction="put"})'
    assert query(prometheus, embeddings)[0][1] > 0
    assert {labels["job"]: value for labels, value in query(prometheus, "up")} == dict.fromkeys(
        jobs, 1.0
    )


def test_every_dashboard_panel_queries_exported_metrics(stack) -> None:
    running, _ = stack
    exported = set()
    for url in running.endpoints["metrics"].values():
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        exported |= {
            line.split("{")[0].split(" ")[0]
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert panels
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\b(?:epd|process|vllm)[a-zA-Z0-9_:]*", target["expr"]))
            assert names, (panel["title"], target["expr"])
            missing = {name for name in names if name not in exported}
            assert not missing, f"panel {panel['title']!r} queries {missing}, not exported"
