"""Removal of the ZMQ socket folders of vLLM engines whose worker was killed.

Each ``VllmEngine`` keeps its engine's ipc sockets in ``<tmp>/vllm-rpc-<pid>-*`` and removes the
folder when it closes; a worker killed with SIGKILL cannot. Such a folder is a leftover once the
process named by its pid is gone, or that pid now belongs to a process started after the folder
was made (the pid was reused). Only this user's folders are touched.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

RPC_DIR = re.compile(r"^vllm-rpc-(\d+)-")
PREFIX = "vllm-rpc"


def rpc_dir_prefix(pid: int) -> str:
    """The name prefix of the socket folder of the engine in process ``pid``."""
    return f"{PREFIX}-{pid}-"


def cleanup_rpc_dirs(tmp_dir: str | None = None) -> list[str]:
    """Remove the socket folders in ``tmp_dir`` (default: the temporary directory) whose process
    is gone; returns their paths."""
    root = Path(tmp_dir or tempfile.gettempdir())
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = RPC_DIR.match(entry.name)
        if match is None:
            continue
        try:
            stat = entry.lstat()
        except OSError:
            continue
        if stat.st_uid != os.getuid() or not entry.is_dir() or entry.is_symlink():
            continue
        if _made_by_a_live_process(int(match.group(1)), stat.st_mtime):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry))
    return removed


def _made_by_a_live_process(pid: int, made_at: float) -> bool:
    started_at = _start_time(pid)
    return started_at is not None and started_at <= made_at + 1.0


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    boot = time.time() - uptime_s
    return boot + ticks / os.sysconf("SC_CLK_TCK")
