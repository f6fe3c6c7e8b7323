"""The scheduler holds soft state only: killed and started again (as Kubernetes replaces its
pod), it is told of every worker again by the workers themselves, which kept serving meanwhile;
the route keeps routing from its last view of the workers while the scheduler is away.
Real processes: `epd scheduler`, an `epd encode`, and (E/PD) an `epd prefill` on the
transformers engine and an `epd route`, on the tiny model."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epd.client import EpdClient, user
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc
from tests.pictures import picture, png

# A worker retries a lost scheduler with backoff up to 5 s (server/worker/registration.py), its
# channel reconnects with backoff up to 5 s too (channels.MAX_RECONNECT_BACKOFF_MS; gRPC's default
# grows to 120 s: 14-19 s after a 30 s outage), and a heartbeat the new scheduler answers
# NOT_FOUND registers it again at once: within about 12 s of the return, however long the outage.
REREGISTER_AFTER_RETURN_S = 12.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        command = [sys.executable, "-m", "epd", *args]
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def is_serving(endpoint: str) -> bool:
    with grpc.insecure_channel(endpoint) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def listed_workers(scheduler: str) -> list[pb.WorkerInfo]:
    with grpc.insecure_channel(scheduler) as channel:
        try:
            reply = pb_grpc.SchedulerServiceStub(channel).ListWorkers(
                pb.ListWorkersRequest(), timeout=2
            )
        except grpc.RpcError:
            return []
        return [w.info for w in reply.workers]


def reported_item_ms(scheduler: str) -> float:
    """The per-item time the encoders last reported to ``scheduler`` (what adaptive learns)."""
    with grpc.insecure_channel(scheduler) as channel:
        try:
            reply = pb_grpc.SchedulerServiceStub(channel).ListWorkers(
                pb.ListWorkersRequest(role=pb.WORKER_ROLE_ENCODE), timeout=2
            )
        except grpc.RpcError:
            return 0.0
        return max((w.load.item_latency_ms for w in reply.workers), default=0.0)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` holds; AssertionError naming ``what`` after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what} within {timeout_s} s"
        time.sleep(0.1)
    return time.monotonic() - started


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    running: list[subprocess.Popen[bytes]] = []
    yield running
    for process in running:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in running:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize("outage_s", [2.0, 30.0])
def test_workers_register_again_with_a_restarted_scheduler(
    outage_s: float, tiny_model_dir: Path, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    scheduler = f"127.0.0.1:{port}"
    log = tmp_path / "processes.log"
    processes.append(start(log, "scheduler", "--port", str(port)))
    model = ["--model", str(tiny_model_dir), "--model-id", "tiny"]
    encoder = ["--device", "cpu", "--threads", "1", "--port", "0", "--scheduler", scheduler]
    processes.append(start(log, "encode", *model, *encoder))
    wait_for(lambda: len(listed_workers(scheduler)) == 1, 180, f"encoder listed\n{log.read_text()}")
    [before] = listed_workers(scheduler)

    processes[0].kill()  # NOTE: as a node failure would: no drain, no goodbye
    processes[0].wait()
    time.sleep(outage_s)
    assert is_serving(before.endpoint), "the encoder stopped serving without its scheduler"

    processes[0] = start(log, "scheduler", "--port", str(port))
    wait_for(lambda: is_serving(scheduler), 60, "the new scheduler serving")
    took_s = wait_for(
        lambda: len(listed_workers(scheduler)) == 1,
        REREGISTER_AFTER_RETURN_S,
        "encoder registered again",
    )
    [after] = listed_workers(scheduler)
    assert (after.id, after.endpoint) == (before.id, before.endpoint)
    print(f"after a {outage_s:.0f} s outage the encoder registered again in {took_s:.1f} s")


def test_the_route_answers_while_the_scheduler_is_away(
    tiny_model_dir: Path, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """E/PD: with the scheduler killed, every request (each with an image, so encoder and
    prefill worker both serve it) is answered from the route's own view; started again, the
    scheduler lists both workers."""
    port, route_port = free_port(), free_port()
    scheduler, route = f"127.0.0.1:{port}", f"127.0.0.1:{route_port}"
    log = tmp_path / "processes.log"
    processes.append(start(log, "scheduler", "--port", str(port)))
    model = ["--model", str(tiny_model_dir), "--model-id", "tiny", "--scheduler", scheduler]
    cpu = ["--device", "cpu", "--port", "0"]
    processes.append(start(log, "encode", *model, *cpu, "--threads", "1"))
    prefill = ["--mode", "prefill_decode", "--engine", "transformers"]
    processes.append(start(log, "prefill", *prefill, *model, *cpu))
    processes.append(start(log, "route", *model, "--port", str(route_port)))

    def running(condition: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            exited = [p.args for p in processes if p.poll() is not None]
            assert not exited, f"exited: {exited}\n{log.read_text()}"
            return condition()

        return check

    wait_for(running(lambda: len(listed_workers(scheduler)) == 2), 240, "workers listed")
    wait_for(running(lambda: is_serving(route)), 120, "route serving")
    question = [user("What is in this picture?", image=png(picture(1)))]
    with EpdClient(route, timeout_s=120) as client:
        expected = client.generate(question, max_tokens=4, ignore_eos=True).token_ids

        processes[0].kill()
        processes[0].wait()
        started = time.monotonic()
        answers = [
            client.generate(question, max_tokens=4, ignore_eos=True).token_ids for _ in range(5)
        ]
        away_s = time.monotonic() - started
    assert answers == [expected] * 5
    assert "routing from its listing" in log.read_text()

    processes[0] = start(log, "scheduler", "--port", str(port))
    wait_for(lambda: is_serving(scheduler), 60, "the new scheduler serving")
    took_s = wait_for(
        lambda: len(listed_workers(scheduler)) == 2,
        REREGISTER_AFTER_RETURN_S,
        "both workers registered again",
    )
    learned_s = took_s + wait_for(
        lambda: reported_item_ms(scheduler) > 0, 10, "the encoder's speed reported again"
    )
    with EpdClient(route, timeout_s=120) as client:
        assert client.generate(question, max_tokens=4, ignore_eos=True).token_ids == expected
    print(
        f"5 requests answered in {away_s:.1f} s without scheduler; workers back in {took_s:.1f} s,"
        f" the encoder's measured speed in {learned_s:.1f} s"
    )
