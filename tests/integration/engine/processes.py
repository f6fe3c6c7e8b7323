"""/proc helpers for process tests: children of a pid, which are still alive, their commands,
and the files they hold or are named after (to find what they leave behind in /tmp, /dev/shm)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def alive(pids: list[int]) -> list[int]:
    """The pids still running (zombies count as gone)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
        except OSError:
            continue
    return running


def wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def entries(*folders: str) -> set[str]:
    """Paths of the entries of ``folders`` now."""
    return {os.path.join(folder, name) for folder in folders for name in os.listdir(folder)}


def named_after(paths: Iterable[str], pids: list[int]) -> set[str]:
    """The ``paths`` whose name holds one of ``pids`` as a whole token (``epd-123-4``)."""
    pattern = re.compile(rf"(?<![0-9A-Za-z])({'|'.join(map(str, pids))})(?![0-9A-Za-z])")
    return {path for path in paths if pattern.search(os.path.basename(path))}


def held_paths(pids: list[int], folders: tuple[str, ...]) -> set[str]:
    """The entries of ``folders`` under which ``pids`` have something open, mapped or bound as a
    unix socket (``/tmp/x`` for ``/tmp/x/y/lib.so``, so that a checkout or virtual environment
    that lives under /tmp compares equal to its entry from before the processes started)."""
    sockets = _unix_socket_paths()
    held: set[str] = set()
    for pid in pids:
        held |= {sockets.get(target, target) for target in _fd_targets(pid)}
        held |= _mapped_files(pid)
    entries_held = set()
    for path in held:
        for folder in folders:
            if path.startswith(f"{folder}/"):
                entries_held.add(os.path.join(folder, path[len(folder) + 1 :].split("/")[0]))
    return entries_held


def _fd_targets(pid: int) -> list[str]:
    targets = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
    except OSError:
        pass
    return targets


def _mapped_files(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {parts[5] for line in f if len(parts := line.rstrip("\n").split(None, 5)) == 6}
    except OSError:
        return set()


def _unix_socket_paths() -> dict[str, str]:
    """``socket:[inode]`` -> the path it is bound to, for named unix sockets."""
    found = {}
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith("/"):
                found[f"socket:[{parts[6]}]"] = parts[7]
    return found
