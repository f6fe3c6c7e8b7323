"""CPU time of processes and their descendants, read from Linux /proc: what the benchmarks
(``bench_e2e.py``, ``bench_scrape.py``) charge to each service."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    tree, pending = [], [pid]
    while pending:
        tree.append(pending.pop())
        pending.extend(children.get(tree[-1], []))
    return tree


def process_cpu(pid: int) -> tuple[str, float]:
    """(name, user+system CPU seconds so far) of ``pid``; OSError once it is gone."""
    return task_cpu(Path(f"/proc/{pid}"))


def task_cpu(task: Path) -> tuple[str, float]:
    """(name, user+system CPU seconds so far) of the process or thread whose /proc folder is
    ``task`` (``/proc/PID`` or ``/proc/PID/task/TID``); OSError once it is gone."""
    stat = (task / "stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds so far of ``pid`` and its descendants alive now."""
    total = 0.0
    for process in process_tree(pid):
        with contextlib.suppress(OSError):
            total += process_cpu(process)[1]
    return total


def cpu_by_process(processes: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process and of each of its descendants (named
    ``name/comm``, e.g. ``prefill/VLLM::Worker``), and of this process (``client``)."""
    totals = {"client": sum(os.times()[:2])}
    for name, root in processes.items():
        for pid in process_tree(root):
            with contextlib.suppress(OSError):
                comm, seconds = process_cpu(pid)
                label = name if pid == root else f"{name}/{comm}"
                totals[label] = totals.get(label, 0.0) + seconds
    return totals
