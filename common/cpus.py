"""Which CPUs a process runs on: CPU lists as Linux writes them (``0-3,8``), and pinning every
thread of a process to one.

A thread's CPU set is its own on Linux (``sched_setaffinity`` on a thread id), and a new thread
starts with its creator's. So pinning a process means pinning each of its threads: a process
pinned early passes its set to every thread and child it starts afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

MAX_CPU_ID = 1 << 16


def parse_cpu_list(text: str) -> list[int]:
    """CPU ids of a list like ``0-3,8,10-11`` (sorted, each once). ValueError, naming the part
    that is wrong, for anything else."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(
                f"CPU list {text!r}: {part!r} is not a CPU id or a range like 0-3"
            ) from None
        if first < 0 or last < first or last >= MAX_CPU_ID:
            raise ValueError(f"CPU list {text!r}: {part!r} is not a range of CPU ids")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``cpus`` as a list like ``0-3,8`` (what ``parse_cpu_list`` reads back)."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def allowed_cpus() -> list[int]:
    """The CPUs the calling thread may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def pin_threads(pid: int, cpus: Iterable[int]) -> int:
    """Put every thread of process ``pid`` on ``cpus``; returns how many threads were pinned
    (a thread that ends meanwhile is skipped). OSError when ``pid`` does not exist or ``cpus``
    holds none this process may use."""
    wanted = set(cpus)
    pinned = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), wanted)
        except ProcessLookupError:
            continue
        pinned += 1
    return pinned


def check_available(cpus: list[int]) -> None:
    """ValueError unless every CPU of ``cpus`` is one this process may use."""
    allowed = allowed_cpus()
    missing = sorted(set(cpus) - set(allowed))
    if missing:
        raise ValueError(
            f"CPUs {format_cpu_list(missing)} are not available to this process "
            f"(it may use {format_cpu_list(allowed)})"
        )
