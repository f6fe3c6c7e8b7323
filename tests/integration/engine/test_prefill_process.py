"""``scripts/prefill.sh --mode prefill`` and ``scripts/decode.sh`` as real processes, started
together: warm engines -> SERVING, one P/D request whose KV crosses processes over NIXL gives
the reference tokens, SIGTERM -> clean exit with no EngineCore left behind, no traceback or
resource_tracker warning in their logs, and no files either: nothing in the processes' own
TMPDIR (vLLM's ZMQ sockets, its ``vllm_dist_*`` files), and nothing new in /tmp or /dev/shm
named after their pids or that they held while serving.

NOTE: the processes get a TMPDIR of their own so that what they leave is told apart from what
other vLLM processes on the machine create meanwhile; names under /tmp and /dev/shm without a pid
(``vllm_dist_*``, ``sem.mp-*``) cannot be."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epd.server.transfer.plane import DataPlane
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from tests.pictures import picture

from .helpers import embedded_prompt, expected_tokens, release
from .processes import alive, children_of, describe, entries, held_paths, named_after, wait_gone

pytestmark = pytest.mark.vllm
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
NUM_TOKENS = 8
SHARED_TMP = ("/tmp", "/dev/shm")


def launch(
    script: str, model_dir: Path, *flags: str, tmp_dir: Path, log: Path
) -> subprocess.Popen[str]:
    """``scripts/SCRIPT`` with TMPDIR ``tmp_dir``, its stdout piped, its stderr (the logs) to
    ``log``."""
    env = {**os.environ, "EPD_VENV": str(Path(sys.executable).parents[1]), "TMPDIR": str(tmp_dir)}
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [
                "bash",
                str(SCRIPTS / script),
                "--model",
                str(model_dir),
                "--model-id",
                "tiny",
                "--port",
                "0",
                "--kv-cache-mb",
                "64",
                *flags,
            ],
            text=True,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )


def stop_while_starting(process: subprocess.Popen[str]) -> list[int]:
    """SIGTERM to ``process`` as soon as it handles SIGTERM (its event loop runs), while its
    engine starts (tens of seconds for vLLM); then wait for its exit. The pids of the child
    processes it had meanwhile (its EngineCore, started after the signal)."""
    deadline = time.monotonic() + 120
    while not handles_sigterm(process.pid):
        assert process.poll() is None and time.monotonic() < deadline, "no SIGTERM handler"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    children: set[int] = set()
    while process.poll() is None:
        assert time.monotonic() < deadline + 120, "not stopped once started"
        children.update(children_of(process.pid))
        time.sleep(0.05)
    return sorted(children)


def handles_sigterm(pid: int) -> bool:
    """Whether ``pid`` catches SIGTERM (bit 15 of SigCgt in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(line for line in status if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def wait_listening(process: subprocess.Popen[str], name: str) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if match := re.search(rf"epd {name} listening on [^:]+:(\d+)", line):
            return f"127.0.0.1:{match.group(1)}"
    raise AssertionError(f"no listening line from epd {name} (exit {process.poll()})")


def is_serving(endpoint: str) -> bool:
    with grpc.insecure_channel(endpoint) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def left_behind(before: set[str], pids: list[int], held: set[str], tmp_dir: Path) -> set[str]:
    """What the processes left: anything in their TMPDIR; new shared entries they held or that
    are named after them."""
    new = entries(*SHARED_TMP) - before
    return (
        entries(str(tmp_dir))
        | named_after(new, pids)
        | {p for p in held - before if os.path.lexists(p)}
    )


def test_pd_processes_serve_hand_kv_over_and_stop_cleanly(
    tiny_model_dir, oracle, tmp_path: Path
) -> None:
    # NOTE: short: vLLM's ZMQ socket paths under it must fit in 107 bytes.
    tmp_dir = Path(tempfile.mkdtemp(prefix="epd-p-", dir="/tmp"))
    before = entries(*SHARED_TMP)
    logs = {name: tmp_path / f"{name}.log" for name in ("prefill", "decode", "stopped")}
    processes = [
        launch(
            "prefill.sh", tiny_model_dir, "--mode", "prefill", tmp_dir=tmp_dir, log=logs["prefill"]
        ),
        launch("decode.sh", tiny_model_dir, tmp_dir=tmp_dir, log=logs["decode"]),
    ]
    stopped = launch("prefill.sh", tiny_model_dir, tmp_dir=tmp_dir, log=logs["stopped"])
    processes.append(stopped)
    plane = DataPlane()
    try:
        stopped_children = stop_while_starting(stopped)
        assert stopped.returncode == 0, logs["stopped"].read_text()[-3000:]
        assert "SIGTERM while starting: stopping once started" in logs["stopped"].read_text()
        assert stopped_children, "its EngineCore started after the signal"
        wait_gone(stopped_children, timeout_s=15)
        assert not alive(stopped_children), [describe(pid) for pid in alive(stopped_children)]
        prefill_at = wait_listening(processes[0], "prefill")
        decode_at = wait_listening(processes[1], "decode")
        engine_processes = [pid for p in processes for pid in children_of(p.pid)]
        assert len(engine_processes) >= 2, "each vLLM EngineCore runs as a child process"
        assert is_serving(prefill_at) and is_serving(decode_at)

        images = [picture(30, 80, 56)]
        prompt = embedded_prompt(oracle, plane, images, "what is this?")
        sampling = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
        with (
            grpc.insecure_channel(prefill_at) as p_channel,
            grpc.insecure_channel(decode_at) as d_channel,
        ):
            first = prefill_grpc.PrefillServiceStub(p_channel).Prefill(
                prefill_pb.PrefillRequest(request_id="proc", prompt=prompt, sampling=sampling),
                timeout=60,
            )
            release(plane, prompt)
            chunks = decode_grpc.DecodeServiceStub(d_channel).Decode(
                decode_pb.DecodeRequest(
                    request_id="proc",
                    prompt_token_ids=prompt.token_ids,
                    sampling=sampling,
                    first_token_id=first.first_token_id,
                    kv_handle=first.kv_handle,
                ),
                timeout=60,
            )
            tokens = [first.first_token_id] + [t for c in chunks for t in c.token_ids]
        assert tokens == expected_tokens(oracle, images, "what is this?", NUM_TOKENS)

        pids = [process.pid for process in processes] + engine_processes
        held = held_paths(pids, SHARED_TMP)
        plane.close()  # NOTE: the test's own segments, which the prefill worker mapped
        assert entries(str(tmp_dir)), "vLLM keeps its ZMQ sockets in TMPDIR while it runs"
        for process in processes[:2]:
            process.send_signal(signal.SIGTERM)
        assert [process.wait(timeout=60) for process in processes[:2]] == [0, 0]
        wait_gone(engine_processes, timeout_s=15)
        assert not alive(engine_processes), [describe(pid) for pid in alive(engine_processes)]
        assert not left_behind(before, pids, held, tmp_dir)
        for name, log in logs.items():
            text = log.read_text()
            for noise in ("Traceback", "TypeError", "leaked semaphore", "leaked shared_memory"):
                assert noise not in text, f"{name}: {noise}\n{text[-3000:]}"
    finally:
        plane.close()
        for process in processes:
            if process.poll() is None:  # NOTE: a failed check: its EngineCore would outlive it
                for child in children_of(process.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGKILL)
            process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()
        shutil.rmtree(tmp_dir, ignore_errors=True)
