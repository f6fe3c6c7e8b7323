"""Removal of what dead processes' engines leave in /dev/shm besides epd's own segments.

A worker killed with its process group (kill -9) takes Python's multiprocessing resource tracker
with it, so the named semaphores of vLLM's EngineCore (``sem.mp-*``) and any
``multiprocessing.shared_memory`` (``psm_*``) or torch (``torch_*``) segments stay in /dev/shm.
Their names say nothing of their owner, so ownership is decided from the living: such a file is
a leftover once no process maps it or holds it open (``/proc/*/maps``, ``/proc/*/fd``), it
belongs to this user, and it is older than ``min_age_s`` (a file just made may not be mapped
yet). A process whose /proc entries cannot be read counts as a possible holder of every file it
could open: then only files private to their owner (mode 0600) are removed. No torch here.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from epd.server.transfer.shm_orphans import SHM_DIR, unlink_files

LEFTOVER = re.compile(r"^(sem\.mp-|psm_|torch_)")
MIN_AGE_S = 5.0


FileId = tuple[int, int]  # (st_dev, st_ino)


@dataclass(slots=True)
class ShmHolders:
    """The files (device, inode) some live process maps or holds open; ``is_complete``: every
    process's /proc entries could be read.

    NOTE: inodes, not paths: glibc makes a named semaphore under a temporary name and links it
    to its own, so /proc/PID/maps shows the temporary name (deleted)."""

    files: set[FileId]
    is_complete: bool


def _mapped(pid: str) -> set[FileId]:
    files = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[4] != "0":
                major, minor = fields[3].split(":")
                files.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
    return files


def _open_files(pid: str) -> set[FileId]:
    files = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            stat = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        files.add((stat.st_dev, stat.st_ino))
    return files


def holders() -> ShmHolders:
    """Scan every process for the files it maps or holds open."""
    found = ShmHolders(set(), True)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            found.files |= _mapped(pid) | _open_files(pid)
        except FileNotFoundError:
            continue  # NOTE: exited during the scan
        except OSError:
            found.is_complete = False
    return found


def leftovers(shm_dir: str = SHM_DIR, min_age_s: float = MIN_AGE_S) -> list[str]:
    """Names of engine leftovers in ``shm_dir`` that no live process can still be using."""
    now = time.time()
    candidates = {}
    for name in os.listdir(shm_dir):
        if not LEFTOVER.match(name):
            continue
        try:
            stat = os.stat(os.path.join(shm_dir, name))
        except FileNotFoundError:
            continue
        if stat.st_uid == os.geteuid() and now - stat.st_mtime >= min_age_s:
            candidates[name] = stat
    if not candidates:
        return []
    held = holders()
    return sorted(
        name
        for name, stat in candidates.items()
        if (stat.st_dev, stat.st_ino) not in held.files
        and (held.is_complete or not stat.st_mode & 0o077)
    )


def cleanup_leftovers(shm_dir: str = SHM_DIR, min_age_s: float = MIN_AGE_S) -> list[str]:
    """Unlink the engine leftovers no live process uses (see the module docstring); returns
    their names."""
    return unlink_files(shm_dir, leftovers(shm_dir, min_age_s))
