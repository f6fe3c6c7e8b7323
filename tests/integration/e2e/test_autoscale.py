"""``epd up --encoders 1:3`` (E/PD, transformers engine) under a burst of image requests, then
quiet: the scheduler's count of encoders needed rises above one, the launcher adds an encoder
that serves part of the burst, and once the burst is over drains it; no request fails, the
drained encoder's process and shared memory are gone, and each change is counted on the
launcher's metrics and traced in the deployment's span file.

The windows are short (flags) and the wait target tight: on this 2-core machine the engine and
route saturate long before one tiny-model encoder does, so a target of a few milliseconds is what
makes the burst need a second encoder here (docs/benchmarks/autoscaling.md)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from epd.client.errors import EpdClientError
from epd.client.messages import user
from epd.client.sdk import AsyncEpdClient
from tests.integration.e2e.launcher import Stack, is_alive, running_stack, segments_of
from tests.pictures import picture, png
from tests.scrape import scrape, value

pytestmark = pytest.mark.integration
FLAGS = (
    *("--topology", "e-pd", "--engine", "transformers", "--encoders", "1:3"),
    *("--scale-up-after-s", "1", "--scale-down-after-s", "4", "--scale-interval-s", "0.25"),
    *("--encode-wait-target-s", "0.002", "--demand-smoothing-s", "3"),
)
BURST_S = 20.0
# The burst goes on past BURST_S until an added encoder was seen serving, at most this long.
MAX_BURST_S = 45.0
CONCURRENCY = 24


def endpoints(stack: Stack) -> dict:
    """The launcher's endpoints file (read again when caught half rewritten)."""
    for _ in range(20):
        try:
            return dict(json.loads((stack.work_dir / "endpoints.json").read_text()))
        except json.JSONDecodeError:
            time.sleep(0.05)
    raise AssertionError("the endpoints file stays unreadable")


def encoders(stack: Stack) -> dict[str, int]:
    """Pid of each encoder running now, as the launcher's endpoints file says."""
    return {k: v for k, v in endpoints(stack)["pids"].items() if k.startswith("encode")}


async def burst(stack: Stack, seen: dict[str, int]) -> tuple[int, int]:
    """Requests about distinct pictures at CONCURRENCY for BURST_S seconds, and on while no
    encoder beyond the first was seen running, up to MAX_BURST_S (every encoder seen running is
    added to ``seen``); (answered, failed)."""
    start, counts = time.monotonic(), [0, 0]

    def goes_on() -> bool:
        elapsed = time.monotonic() - start
        return elapsed < BURST_S or (len(seen) < 2 and elapsed < MAX_BURST_S)

    async def client_loop(client: AsyncEpdClient, lane: int) -> None:
        while goes_on():
            image = png(picture(1000 * lane + sum(counts), 448, 448))
            try:
                await client.generate([user("What is it?", image=image)], max_tokens=2)
                counts[0] += 1
            except EpdClientError:
                counts[1] += 1
            seen.update(encoders(stack))

    async with AsyncEpdClient(stack.route, timeout_s=120) as client:
        await asyncio.gather(*(client_loop(client, lane) for lane in range(CONCURRENCY)))
    return counts[0], counts[1]


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.25)
    return False


def test_a_burst_adds_an_encoder_and_quiet_drains_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    with running_stack(tiny_model_dir, tmp_path, *FLAGS) as stack:
        assert list(encoders(stack)) == ["encode0"]
        seen: dict[str, int] = {}
        answered, failed = asyncio.run(burst(stack, seen))
        assert failed == 0 and answered > 0
        added = {name: pid for name, pid in seen.items() if name != "encode0"}
        assert added, f"no encoder added:\n{(tmp_path / 'launcher.log').read_text()}"
        url = endpoints(stack)["metrics"]["launcher"]
        assert wait_for(lambda: value(scrape(url), "epd_launcher_encoders", device="cpu") == 1, 60)
        assert list(encoders(stack)) == ["encode0"]
        assert not any(is_alive(pid) for pid in added.values())
        assert segments_of(list(added.values())) == []
        launcher = scrape(url)
        up = value(launcher, "epd_launcher_encoder_scalings_total", direction="up")
        down = value(launcher, "epd_launcher_encoder_scalings_total", direction="down")
        assert up == down >= 1
        lines = (stack.run_dir / "spans.jsonl").read_text().splitlines()
        spans = [json.loads(line) for line in lines if line.strip()]
        changes = [s for s in spans if s["name"].startswith("autoscale.")]
        assert [s["name"] for s in changes].count("autoscale.add_encoder") == up
        assert [s["name"] for s in changes].count("autoscale.drain_encoder") == down
        served = {
            s["attributes"].get("epd.encoder_id")
            for s in spans
            if s["name"] == "/epd.v1.EncodeService/Encode"
        }
        # NOTE: an added encoder served part of the burst; one added as the burst ends may get
        # no image before its drain (seen in CI: encode2 added 7 s after encode1, then drained).
        assert served & set(added), (served, added)
    log = (tmp_path / "launcher.log").read_text()
    assert "autoscale cpu: added encode1" in log and "autoscale cpu: drained encode1" in log
