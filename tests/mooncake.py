"""A real Mooncake master for tests, started as ``epd up`` starts it (``launch/store_service``),
and a raw Mooncake client to write into its store. Tests that need one skip, with the reason,
only where Mooncake's wheel cannot be loaded on the machine (scripts/install.sh installs it)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from epd.launch.launcher import Deployment
from epd.launch.store_service import MasterAddress, StartedMaster, start_master
from epd.server.store.client import MooncakeSettings


def skip_without_mooncake() -> None:
    """Skip the calling test when Mooncake's store module cannot be loaded here."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        pytest.skip(f"Mooncake cannot be loaded here ({e}); scripts/install.sh installs it")


@asynccontextmanager
async def running_master(run_dir: Path) -> AsyncIterator[StartedMaster]:
    """A master serving on free loopback ports, stopped (SIGTERM, then SIGKILL) at the end."""
    skip_without_mooncake()
    deployment = Deployment(run_dir, dict(os.environ))
    master = start_master(deployment)
    try:
        await master.ready_args()
        yield master
    finally:
        deployment.stop(grace_s=10)


def settings_of(address: MasterAddress, **changes: Any) -> MooncakeSettings:
    """Client settings for the store of ``address``: small segments, a 1 s timeout by default
    (this machine's CPUs are shared), ``changes`` on top."""
    values: dict[str, Any] = {
        "timeout_s": 1.0,
        "segment_bytes": 32 << 20,
        "buffer_bytes": 16 << 20,
        **changes,
    }
    return MooncakeSettings(address.master, address.metadata_server, **values)


def raw_client(address: MasterAddress) -> Any:
    """A plain ``MooncakeDistributedStore`` joined to the store of ``address``."""
    from mooncake.store import MooncakeDistributedStore

    client = MooncakeDistributedStore()
    status = client.setup(
        "127.0.0.1", address.metadata_server, 16 << 20, 16 << 20, "tcp", "", address.master
    )
    assert status == 0, f"setup failed ({status})"
    return client


def freeze(master: StartedMaster, timeout_s: float = 10) -> None:
    """Stop the master's process (SIGSTOP): it holds its connections but answers nothing.
    Returns once every thread of it is stopped (the signal is delivered asynchronously)."""
    pid = master.child.process.pid
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not is_stopped(pid):
        assert time.monotonic() < deadline, f"the master ({pid}) did not stop"
        time.sleep(0.01)


def is_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped by a signal (state T)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state == "T" for state in states)


def thaw(master: StartedMaster) -> None:
    os.kill(master.child.process.pid, signal.SIGCONT)


def kill(master: StartedMaster) -> None:
    """Kill the master (SIGKILL) and reap it."""
    master.child.process.kill()
    master.child.process.wait()
