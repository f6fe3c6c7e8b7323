"""``epd up --embedding-store mooncake`` (E/PD, two encoders): the Mooncake master and its
segment holder start as two more services and the encoders join the store; an image one encoder
encoded is served by the other without its tower (counted by both encoders' metrics), and by
either once both were killed and restarted (the value lives in the holder); the master killed
under load fails no request; and the store's services stop with the rest."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from epd.client import EpdClient, user
from epd.common.channels import create_channel, wait_for_health
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.integration.e2e.launcher import Stack, is_alive, running_stack
from tests.mooncake import skip_without_mooncake
from tests.pictures import picture, png
from tests.scrape import scrape, value

pytestmark = pytest.mark.integration

ENCODERS = ("encode0", "encode1")
NUM_UNDER_LOAD = 16


def metric(stack: Stack, service: str, name: str, **labels: str) -> float:
    return value(scrape(stack.endpoints["metrics"][service]), name, **labels)


def wait_for(condition, what: str, timeout_s: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def joined(stack: Stack, times: int = 1) -> bool:
    """Whether each encoder joined the store ``times`` times (once per start: its log grows)."""
    logs = [(stack.run_dir / f"{encoder}.log").read_text() for encoder in ENCODERS]
    return all(log.count("joined the embedding store") == times for log in logs)


def ask(stack: Stack, seed: int) -> None:
    with EpdClient(stack.route, timeout_s=120) as client:
        answer = client.generate(
            [user("What is in this picture?", image=png(picture(seed, 64, 64)))], max_tokens=2
        )
    assert answer.token_ids


async def encode_directly(endpoint: str, data: bytes) -> pb.EncodeResponse:
    """One image encoded by the encoder at ``endpoint``, its lease released."""
    async with create_channel(endpoint) as channel:
        stub = pb_grpc.EncodeServiceStub(channel)
        request = pb.EncodeRequest(items=[multimodal_pb2.MediaItem(data=data)])
        (response,) = [r async for r in stub.Encode(request)]
        await stub.Release(pb.ReleaseRequest(lease_ids=[response.embeddings.lease_id]))
    return response


def test_up_with_the_store_shares_encodings_and_outlives_its_master(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_without_mooncake()
    # NOTE: a store lookup may take longer than the default 50 ms on a busy CI machine
    monkeypatch.setenv("EPD_STORE_TIMEOUT_MS", "2000")
    flags = ("--topology", "e-pd", "--engine", "transformers", "--encoders", "2")
    flags += ("--embedding-store", "mooncake", "--max-restarts", "4")
    with running_stack(tiny_model_dir, tmp_path, *flags) as stack:
        master_pid = stack.pids["store-master"]
        wait_for(lambda: joined(stack), "both encoders to join the store")
        ask(stack, seed=70)
        towers = {e: metric(stack, e, "epd_encode_images_total") for e in ENCODERS}
        assert sorted(towers.values()) == [0, 1], towers
        first = max(towers, key=towers.__getitem__)
        second = min(towers, key=towers.__getitem__)
        stored = ("epd_encode_store_publishes_total", {"outcome": "stored"})
        wait_for(lambda: metric(stack, first, stored[0], **stored[1]) == 1, "the publish")
        served = asyncio.run(encode_directly(stack.endpoints[second], png(picture(70, 64, 64))))
        assert served.cache_hit
        assert metric(stack, second, "epd_encode_images_total") == 0
        assert metric(stack, second, "epd_encode_store_lookups_total", outcome="hit") == 1
        restart_encoders(stack)
        served = asyncio.run(encode_directly(stack.endpoints[first], png(picture(70, 64, 64))))
        assert served.cache_hit
        assert metric(stack, first, "epd_encode_images_total") == 0
        assert metric(stack, first, "epd_encode_store_lookups_total", outcome="hit") == 1
        failures = under_load_killing(stack, master_pid)
        run_dir, holder_pid = stack.run_dir, stack.pids["store-holder"]
    assert failures == [], failures
    assert "Master service started" in (run_dir / "store-master.log").read_text()
    assert "left the embedding store" in (run_dir / "store-holder.log").read_text()
    assert not is_alive(master_pid) and not is_alive(holder_pid)
    for encoder in ENCODERS:
        assert "Traceback" not in (run_dir / f"{encoder}.log").read_text()


def restart_encoders(stack: Stack) -> None:
    """Kill both encoders (SIGKILL: nothing of theirs survives but what the store holds) and
    return once ``epd up`` restarted them and they joined the store again and serve."""
    for encoder in ENCODERS:
        os.kill(stack.pids[encoder], signal.SIGKILL)
    wait_for(lambda: joined(stack, times=2), "both encoders to restart and join", timeout_s=180)
    for encoder in ENCODERS:
        asyncio.run(wait_for_health(stack.endpoints[encoder], timeout_s=120))


def under_load_killing(stack: Stack, master_pid: int) -> list[str]:
    """``NUM_UNDER_LOAD`` requests, four at a time, each about a new image; the master is
    killed (SIGKILL) once four are answered, while the next ones run. The failures, as text."""
    failures: list[str] = []

    def one(seed: int) -> None:
        try:
            ask(stack, seed)
        except Exception as e:  # NOTE: every failure is the test's finding
            failures.append(f"{seed}: {e!r}")

    with ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(one, seed) for seed in range(100, 100 + NUM_UNDER_LOAD)]
        wait_for(lambda: sum(a.done() for a in answers) >= 4, "four answers", timeout_s=300)
        os.kill(master_pid, signal.SIGKILL)
        for answer in answers:
            answer.result()
    return failures
