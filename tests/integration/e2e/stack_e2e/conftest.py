"""A whole E/P/D deployment (``epd up``'s default topology) with two encoders and two decode
workers as real processes, started by the launcher the scripts use (``epd up --keep``):
- answers equal the monolithic reference token for token; every service answers reflection;
- an encoder and a decode worker SIGKILLed under load, then the other decode worker SIGTERMed,
  cost no request (their streams resume through the other decode worker, token for token);
- a decode worker whose prefill worker died before it read the KV fails its stream UNAVAILABLE
  KV_LOAD_FAILED (never a short answer);
- bad inputs get clear errors and leave the stack up; one request's spans form one tree across
  every service;
- after shutdown nothing is left running or in /dev/shm, and the log of no process that was not
  SIGKILLed holds a traceback or a resource_tracker warning.

One deployment serves every module of this package; the modules run in file order, the one
that kills workers last (``test_workers_killed.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.e2e.launcher import (
    Stack,
    is_alive,
    running_stack,
    segments_of,
    session_members,
)
from tests.integration.e2e.stack_e2e.faults import KILLED


@pytest.fixture(scope="package")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work_dir = tmp_path_factory.mktemp("stack")
    with running_stack(
        tiny_model_dir,
        work_dir,
        *("--encoders", "2", "--default-policy", "per_image", "--decode-workers", "2"),
    ) as running:
        yield running
    children = list(running.pids.values())
    assert not [pid for pid in children if is_alive(pid)]
    for pid in children:  # NOTE: each child leads its own session; vLLM's engine cores too
        assert session_members(pid) == [], f"session of {pid} left processes behind"
    # NOTE: the SIGKILLed encoder (KILLED) could not clean up after itself: the launcher did
    assert segments_of(children) == []
    for service in set(running.pids) - KILLED:  # NOTE: decode1 was SIGTERMed under load too
        log = (running.run_dir / f"{service}.log").read_text()
        for noise in ("Traceback", "TypeError", "leaked semaphore", "leaked shared_memory"):
            assert noise not in log, f"{service}.log: {noise}\n{log[-3000:]}"
