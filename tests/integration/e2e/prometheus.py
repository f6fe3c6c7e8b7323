"""A real Prometheus server for tests: installed from Debian's package where absent (root and
apt-get needed; otherwise the test is skipped with the reason), scraping static targets."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from epd.launch.free_ports import free_port


def prometheus_binary() -> str:
    """Path of ``prometheus``, installing Debian's package first if needed; skips the test when
    it cannot be had."""
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("prometheus is not installed and apt-get cannot install it (needs root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]
    result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=600)
        result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    found = shutil.which("prometheus")
    if not found:
        pytest.skip(f"apt-get could not install prometheus: {result.stderr[-500:]}")
    return found


@contextlib.contextmanager
def running_prometheus(targets: dict[str, str], work_dir: Path) -> Iterator[str]:
    """Prometheus scraping each ``job name -> metrics URL`` every second; yields its base URL."""
    scrape_configs = []
    for job, url in sorted(targets.items()):
        parsed = urllib.parse.urlparse(url)
        scrape_configs.append(
            {
                "job_name": job,
                "metrics_path": parsed.path,
                "static_configs": [{"targets": [parsed.netloc]}],
            }
        )
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": scrape_configs,
    }
    config_file = work_dir / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # NOTE: JSON is YAML
    address = f"127.0.0.1:{free_port()}"
    log = open(work_dir / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={work_dir / 'tsdb'}",
            f"--web.listen-address={address}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://{address}"
    try:
        deadline = time.monotonic() + 30
        while not _is_ready(base):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "prometheus did not start:\n"
                    + (work_dir / "prometheus.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _is_ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def query(base: str, promql: str) -> list[tuple[dict[str, str], float]]:
    """An instant PromQL query through the HTTP API: (labels, value) per series."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return [(series["metric"], float(series["value"][1])) for series in body["data"]["result"]]


def query_until(base: str, promql: str, expected: float, timeout_s: float = 20) -> float:
    """The single value of ``promql`` once it equals ``expected`` (Prometheus scrapes every
    second), or the last value seen after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = query(base, promql)
        last = result[0][1] if len(result) == 1 else float("nan")
        if last == expected or time.monotonic() > deadline:
            return last
        time.sleep(0.5)
