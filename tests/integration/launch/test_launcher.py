"""How ``epd up`` stops, watches and restarts its children: real child processes (fakes that
hold a shared-memory segment like a producer), killed and reaped."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epd.launch.launcher import Child, Deployment
from epd.launch.monitor import ChildDied, WatchOptions, until_a_child_dies, watch
from epd.server.transfer import shm


def test_stop_ends_every_process_of_a_child_group(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, {})
    script = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(60)']); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    from epd.launch.launcher import Child, _group_alive

    deployment.children.append(Child("sleeper", 0, process, tmp_path / "log"))
    time.sleep(0.5)
    start = time.monotonic()
    deployment.stop(grace_s=1.0)
    assert not _group_alive(process.pid)  # the grandchild ignoring SIGTERM was killed too
    assert time.monotonic() - start < 10


_PRODUCER = """
import os, sys, time
from epd.server.transfer.shm import SHM_DIR, process_prefix
open(os.path.join(SHM_DIR, process_prefix() + "1"), "wb").close()
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(int(sys.argv[2]))
"""


def start_fake(deployment: Deployment, name: str, lifetime_s: float = 60, code: int = 0) -> Child:
    """A child that creates a shared-memory segment named like a producer's, then lives
    ``lifetime_s`` and exits with ``code``."""
    command = [sys.executable, "-c", _PRODUCER, str(lifetime_s), str(code)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    process.stdout.close()
    child = Child(name, 0, process, deployment.run_dir / f"{name}.log", command=command)
    deployment.children.append(child)
    return child


def segments_of(pid: int) -> list[str]:
    return [name for name in shm.list_segments() if name.startswith(f"epd-{pid}-")]


def test_stop_removes_the_segments_of_a_child_killed_with_sigkill(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, {})
    child = start_fake(deployment, "encode0")
    assert segments_of(child.process.pid)
    os.kill(child.process.pid, signal.SIGKILL)
    deployment.stop(grace_s=1.0)
    assert segments_of(child.process.pid) == []


async def test_a_dead_child_ends_the_work_with_its_signal_and_log(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, {})
    healthy = start_fake(deployment, "scheduler")
    victim = start_fake(deployment, "encode0")
    os.kill(victim.process.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ChildDied) as died:
        await until_a_child_dies(deployment, asyncio.Event().wait(), interval_s=0.05)
    assert time.monotonic() - start < 5
    log = tmp_path / "encode0.log"
    assert str(died.value) == f"encode0 (pid {victim.process.pid}) was killed by SIGKILL; log {log}"
    assert segments_of(victim.process.pid) == []  # removed as soon as the death was noticed
    assert segments_of(healthy.process.pid)
    deployment.stop(grace_s=1.0)


async def test_a_child_that_died_while_the_work_ended_is_reported(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, {})
    victim = start_fake(deployment, "prefill", lifetime_s=0, code=3)
    victim.process.wait()
    message = rf"prefill \(pid {victim.process.pid}\) exited with code 3"
    with pytest.raises(ChildDied, match=message):
        await until_a_child_dies(deployment, asyncio.sleep(0), interval_s=60)
    deployment.stop(grace_s=1.0)


async def test_work_that_ends_first_is_returned(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, {})
    start_fake(deployment, "scheduler")
    work = asyncio.sleep(0.1, "done")
    assert await until_a_child_dies(deployment, work, interval_s=0.05) == "done"
    deployment.stop(grace_s=1.0)


async def test_keep_restarts_a_dead_child_until_its_restarts_run_out(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, {})
    crashing = start_fake(deployment, "encode0", lifetime_s=0.2, code=1)
    first_pid = crashing.process.pid
    reports: list[str] = []
    restarted: list[int] = []
    options = WatchOptions(max_restarts=2, interval_s=0.05)
    gave_up = "encode0 .* exited with code 1; .*gave up after 2 restarts"
    with pytest.raises(ChildDied, match=gave_up):
        await asyncio.wait_for(
            watch(deployment, options, reports.append, lambda c: restarted.append(c.process.pid)),
            timeout=60,
        )
    assert len(reports) == 2 and reports[0].startswith(f"epd up: encode0 (pid {first_pid}) exited")
    assert "restarting it (1 of 2)" in reports[0] and "(2 of 2)" in reports[1]
    assert len(set(restarted)) == 2 and first_pid not in restarted
    assert "restarting it" in (tmp_path / "encode0.log").read_text()
    deployment.stop(grace_s=1.0)
    assert [segments_of(pid) for pid in (first_pid, *restarted)] == [[], [], []]
