"""Append records to a file that several processes share, within a size cap.

The file holds at most half the cap; a write that would take it past that first renames it to
``PATH.1`` (replacing the previous one), so the two files together never hold more than the cap
(a single record larger than half the cap is still written whole, into a file of its own).
Rotation is safe between processes: a writer holds an exclusive ``flock`` on the file it appends
to, and one that finds, once it holds the lock, that the file was renamed meanwhile reopens it.
"""

from __future__ import annotations

import fcntl
import os


def rotated_path(path: str) -> str:
    """Where ``append`` moves ``path`` when it is full."""
    return f"{path}.1"


def append(path: str, data: bytes, max_bytes: int) -> None:
    """Append ``data`` to ``path``; ``max_bytes`` caps ``path`` and ``path.1`` together (0: no
    cap, the file grows without bound)."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _is_current(fd, path):
                continue  # NOTE: another writer rotated it after we opened it
            size = os.fstat(fd).st_size
            if max_bytes and size and size + len(data) > max_bytes // 2:
                os.replace(path, rotated_path(path))
                continue
            os.write(fd, data)
            return
        finally:
            os.close(fd)  # NOTE: also releases the lock


def _is_current(fd: int, path: str) -> bool:
    """Whether ``fd`` is still the file named ``path``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)
