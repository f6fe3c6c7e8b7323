"""Engine leftovers in /dev/shm (multiprocessing semaphores): kept while any live process holds
them, removed once their holders were killed with their resource tracker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from epd.launch.launcher import Child, Deployment
from epd.server.transfer import shm_leftovers

HOLDER = """
import multiprocessing, sys, time
semaphore = multiprocessing.get_context("spawn").Semaphore()
print(semaphore._semlock.name, flush=True)
time.sleep(120)
"""


def start_holder() -> tuple[subprocess.Popen[str], str]:
    """A process (in its own group, with its resource tracker) holding a named semaphore."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout is not None
    name = "sem." + process.stdout.readline().strip().lstrip("/")
    assert os.path.exists(os.path.join(shm_leftovers.SHM_DIR, name))
    return process, name


def test_a_semaphore_is_kept_while_its_holder_lives_and_removed_once_its_group_is_killed() -> None:
    holder, name = start_holder()
    try:
        stat = os.stat(os.path.join(shm_leftovers.SHM_DIR, name))
        assert (stat.st_dev, stat.st_ino) in shm_leftovers.holders().files
        assert name not in shm_leftovers.cleanup_leftovers(min_age_s=0)
        assert os.path.exists(os.path.join(shm_leftovers.SHM_DIR, name))
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.communicate()
    assert os.path.exists(os.path.join(shm_leftovers.SHM_DIR, name))  # the tracker died too
    assert name not in shm_leftovers.cleanup_leftovers(min_age_s=3600)  # too young to judge
    assert name in shm_leftovers.cleanup_leftovers(min_age_s=0)
    assert not os.path.exists(os.path.join(shm_leftovers.SHM_DIR, name))


def test_only_known_engine_names_owned_by_this_user_are_candidates(tmp_path: Path) -> None:
    for name in ["sem.mp-dead", "psm_dead", "torch_1_2", "epd-1-2-3", "other-program"]:
        (tmp_path / name).touch(mode=0o600)
    assert shm_leftovers.leftovers(str(tmp_path), min_age_s=0) == [
        "psm_dead",
        "sem.mp-dead",
        "torch_1_2",
    ]


def test_a_file_open_in_a_live_process_is_kept(tmp_path: Path) -> None:
    (tmp_path / "sem.mp-open").touch(mode=0o600)
    with open(tmp_path / "sem.mp-open"):
        assert shm_leftovers.cleanup_leftovers(str(tmp_path), min_age_s=0) == []
    assert shm_leftovers.cleanup_leftovers(str(tmp_path), min_age_s=0) == ["sem.mp-open"]


def test_the_launcher_removes_what_a_child_killed_with_its_group_left(tmp_path: Path) -> None:
    holder, name = start_holder()
    path = os.path.join(shm_leftovers.SHM_DIR, name)
    aged = os.stat(path).st_mtime - 2 * shm_leftovers.MIN_AGE_S
    os.utime(path, (aged, aged))
    deployment = Deployment(tmp_path, {})
    deployment.children.append(Child("prefill", 0, holder, tmp_path / "prefill.log"))  # type: ignore[arg-type]
    os.killpg(holder.pid, signal.SIGKILL)
    holder.communicate()
    assert deployment.reap_dead() and not os.path.exists(path)
