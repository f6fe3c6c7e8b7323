"""Which shared-memory segments are orphans: those of exited, killed (zombie) or reused pids."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from epd.server.transfer import shm_orphans


def test_a_killed_process_not_yet_waited_for_is_gone() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert shm_orphans.start_time(process.pid) is not None
    os.kill(process.pid, signal.SIGKILL)
    while not _is_zombie(process.pid):
        pass
    assert shm_orphans.start_time(process.pid) is None
    process.wait()


def test_orphans_are_segments_of_dead_and_reused_pids(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    own = shm_orphans.process_prefix()
    reused = f"epd-{os.getpid()}-1-"  # NOTE: this pid, but a start time that is not ours
    names = [f"{own}1", f"epd-{dead.pid}-5-1", f"{reused}2", "epd-other"]
    for name in names:
        (tmp_path / name).touch()
    assert shm_orphans.orphans(str(tmp_path)) == sorted([f"epd-{dead.pid}-5-1", f"{reused}2"])
    assert sorted(shm_orphans.cleanup_orphans(str(tmp_path))) == sorted(
        [f"epd-{dead.pid}-5-1", f"{reused}2"]
    )
    assert sorted(os.listdir(tmp_path)) == [f"{own}1", "epd-other"]


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"
