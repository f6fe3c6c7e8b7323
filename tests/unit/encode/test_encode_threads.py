"""The encoder's pool threads: named for the OS, each with its own number of torch threads."""

from __future__ import annotations

import json
import subprocess
import sys

# NOTE: in a process of its own, as an encoder runs: torch's thread settings are process-wide
# state that other tests' leftover threads in the pytest process have been seen to change.
SCENARIO = """
import json
from pathlib import Path

import torch

from epd.server.encode.app import EncodeConfig, threads_of


def os_name_and_torch_threads():
    matrix = torch.ones(64, 64)
    (matrix @ matrix).sum()
    return Path("/proc/thread-self/comm").read_text().strip(), torch.get_num_threads()


pool, tower = threads_of(EncodeConfig(Path("unused"), preprocess_threads=2))
pool.submit(lambda: None).result()
tower.submit(lambda: None).result()
print(json.dumps({
    "process": torch.get_num_threads(),
    "prepare": pool.submit(os_name_and_torch_threads).result(),
    "tower": tower.submit(os_name_and_torch_threads).result(),
}))
"""


def test_each_pool_thread_keeps_its_name_and_torch_threads_whichever_starts_first() -> None:
    """``top -H``, ``ps -L``, py-spy and bench_encode's CPU by thread tell the threads apart; a
    preparing thread computes with one torch thread and the tower with the process's, even when
    the tower's thread starts between a preparing thread's start and its first torch call (torch
    sets a thread up at its first parallel call with the number set last by any thread)."""
    result = subprocess.run(
        [sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["prepare"] == ["epd-prepare", 1]
    assert seen["tower"] == ["epd-tower", seen["process"]]
