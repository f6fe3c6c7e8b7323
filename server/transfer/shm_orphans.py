"""Names of shared-memory segments, and the removal of those whose producer is gone.

A producer names its segments ``epd-<pid>-<process start time>-<n>``. The segments of a pid are
orphans once ``/proc/<pid>`` shows no running process with that start time: the process exited
or was killed (a zombie, killed but not yet waited for, counts as gone: it can no longer use or
unlink them), or its pid now belongs to another process (a reused pid comes with another start
time). Producers sweep at start and from their data plane's reaper; the launcher sweeps when a
child dies and when it stops. No torch here, so the launcher sweeps without importing it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

SHM_DIR = "/dev/shm"
NAME = re.compile(r"^epd-(\d+)-(\d+)-\d+$")


def start_time(pid: int) -> int | None:
    """Start time of running process ``pid`` in clock ticks since boot (/proc/PID/stat field
    22); None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    try:
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (IndexError, ValueError):
        return None


def process_prefix(pid: int | None = None) -> str:
    """Segment name prefix of process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"epd-{pid}-{start_time(pid) or 0}-"


def list_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Names of every epd segment in ``shm_dir`` (all processes)."""
    return sorted(name for name in os.listdir(shm_dir) if NAME.match(name))


def orphans(shm_dir: str = SHM_DIR) -> list[str]:
    """Segments whose creating process is gone (or whose pid now belongs to another process)."""
    start_times: dict[int, int | None] = {}
    found = []
    for name in list_segments(shm_dir):
        match = NAME.match(name)
        assert match is not None
        pid = int(match.group(1))
        if pid not in start_times:
            start_times[pid] = start_time(pid)
        if start_times[pid] != int(match.group(2)):
            found.append(name)
    return found


def cleanup_orphans(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink segments whose creating process is gone (or whose pid was reused). Returns names."""
    return unlink_files(shm_dir, orphans(shm_dir))


def unlink_files(shm_dir: str, names: Iterable[str]) -> list[str]:
    """Unlink the files ``names`` of ``shm_dir``; returns those this call removed (another
    process may have removed some first)."""
    removed = []
    for name in names:
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed
