"""One E/PD deployment (``epd up --keep --topology e-pd --engine transformers``) and three checks
on it, in the order they need it (one deployment instead of three, for the suite's time):

- a real Prometheus scrapes it: after a known set of requests (one image, repeated), PromQL over
  Prometheus's HTTP API counts exactly them, a cache hit for each repeat, and no lease
  outstanding once idle; the Grafana dashboard queries only metrics the services export (first:
  the counts start from a fresh deployment);
- a route started by hand (``epd route``, no tracing) against workers that trace (as ``epd up``
  starts them) answers like the deployment's own route: traced and untraced processes call each
  other with the same plain RPCs;
- a SIGKILLed encoder is reported and restarted by the launcher, which removes its shared memory
  at once, and the deployment answers as before; once stopped, nothing of any of its processes
  is left in /dev/shm (last: it kills)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from epd.client import EpdClient, user
from epd.common.channels import wait_for_health
from epd.launch.free_ports import free_port
from epd.launch.up_cli import SPAN_FILE
from tests.integration.e2e.launcher import (
    Stack,
    epd_command,
    is_alive,
    running_stack,
    segments_of,
)
from tests.integration.e2e.prometheus import (
    prometheus_binary,
    query,
    query_until,
    running_prometheus,
)
from tests.pictures import picture, png

DASHBOARD = Path(__file__).parents[3] / "deploy" / "grafana" / "epd.json"
NUM_REQUESTS = 3
QUESTION = "What is in this picture?"
_RESTARTED: list[int] = []


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work_dir = tmp_path_factory.mktemp("e-pd")
    topology = ("--topology", "e-pd", "--engine", "transformers")
    with running_stack(tiny_model_dir, work_dir, *topology, timeout_s=240) as running:
        yield running
    assert running.launcher.returncode == 130
    assert segments_of([*running.pids.values(), *_RESTARTED]) == []


@pytest.fixture(scope="module")
def prometheus(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus server scraping every service of ``stack``: its base URL."""
    prometheus_binary()  # NOTE: installs it, or skips
    with running_prometheus(
        stack.endpoints["metrics"], tmp_path_factory.mktemp("prometheus")
    ) as base:
        yield base


def test_promql_counts_the_requests_sent(stack: Stack, prometheus: str) -> None:
    running = stack
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


def test_every_dashboard_panel_queries_exported_metrics(stack: Stack) -> None:
    running = stack
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


def test_an_untraced_route_serves_with_traced_workers(
    stack: Stack, tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPD_TRACE")}
    log = open(tmp_path / "route-by-hand.log", "wb")  # noqa: SIM115 - closed below
    route = subprocess.Popen(
        epd_command(
            "route",
            tiny_model_dir,
            "--scheduler",
            str(stack.endpoints["scheduler"]),
            "--port",
            str(port),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    try:
        asyncio.run(wait_for_health(f"127.0.0.1:{port}", timeout_s=120))
        image = png(picture(5))
        with EpdClient(stack.route, timeout_s=120) as client:
            expected = client.generate([user(QUESTION, image=image)], max_tokens=6)
        with EpdClient(f"127.0.0.1:{port}", timeout_s=120) as client:
            answers = [
                client.generate([user(QUESTION, image=png(picture(5 + i)))], max_tokens=6)
                for i in range(3)
            ]
    finally:
        route.terminate()
        route.wait(60)
        log.close()
    spans = (stack.run_dir / SPAN_FILE).read_text()
    assert answers[0].token_ids == expected.token_ids and expected.token_ids
    assert all(len(answer.token_ids) == 6 for answer in answers)
    assert "EncodeService/Encode" in spans  # NOTE: the encoder did trace its calls


def test_a_killed_encoder_is_reported_restarted_and_leaves_no_shared_memory(stack: Stack) -> None:
    """Runs last in this module (it kills); what the launcher must remove once it has stopped
    the deployment is checked by ``stack`` at the end."""
    question = [user(QUESTION, image=png(picture(1, 64, 64)))]
    with EpdClient(stack.route, timeout_s=120) as client:
        expected = client.generate(question, max_tokens=2, ignore_eos=True).token_ids
    killed = stack.pids["encode0"]
    assert segments_of([killed]), "the encoder put no tensor into shared memory"
    os.kill(killed, signal.SIGKILL)
    line = f"epd up: encode0 (pid {killed}) was killed by SIGKILL; log {stack.run_dir}"
    log = stack.work_dir / "launcher.log"
    deadline = time.monotonic() + 30
    while line not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert line in log.read_text() and "restarting it (1 of 3)" in log.read_text()
    assert segments_of([killed]) == []  # removed as soon as the launcher noticed
    # NOTE: the launcher reports the restart, then restarts and rewrites the endpoints file
    endpoints = json.loads((stack.work_dir / "endpoints.json").read_text())
    while endpoints["pids"]["encode0"] == killed and time.monotonic() < deadline:
        time.sleep(0.2)
        endpoints = json.loads((stack.work_dir / "endpoints.json").read_text())
    restarted = endpoints["pids"]["encode0"]
    assert restarted != killed and is_alive(restarted)
    _RESTARTED.append(restarted)
    asyncio.run(wait_for_health(endpoints["encode0"], timeout_s=60))
    with EpdClient(stack.route, timeout_s=120) as client:
        assert client.generate(question, max_tokens=2, ignore_eos=True).token_ids == expected
