"""The socket folders of killed vLLM engines are removed; a live engine's folder is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from epd.server.engine.rpc_leftovers import cleanup_rpc_dirs, rpc_dir_prefix


def folder_of(tmp_path: Path, pid: int) -> Path:
    folder = tmp_path / f"{rpc_dir_prefix(pid)}abc"
    folder.mkdir()
    (folder / "socket").touch()
    return folder


def test_a_dead_process_s_folder_goes_and_a_live_one_s_stays(tmp_path: Path) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        kept = folder_of(tmp_path, live.pid)
        gone = folder_of(tmp_path, dead.pid)
        other = tmp_path / "vllm-rpc-notapid"
        other.mkdir()
        assert cleanup_rpc_dirs(str(tmp_path)) == [str(gone)]
        assert kept.exists() and other.exists() and not gone.exists()
    finally:
        live.kill()
        live.wait()


def test_a_folder_older_than_the_process_now_holding_its_pid_goes(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, os.getpid())
    made_before_this_process = time.time() - 3600 * 24 * 365
    os.utime(folder, (made_before_this_process, made_before_this_process))
    assert cleanup_rpc_dirs(str(tmp_path)) == [str(folder)]
